"""The run's next SLURM job once one has ended: after a node failure, on a spare
(--spares) or on the nodes left (--min-nodes; spares.py and shrink.py decide); after the
ranks stopped at a checkpoint for a lost node back, on more nodes (grow_back.py); after a time
limit or a preemption, the same job again (segments.py); or none, and the run ends."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from orchestrator.agent.ranks import RankFile
from orchestrator.slurm.grow_back import SlurmRegrow
from orchestrator.slurm.job import SlurmJob
from orchestrator.slurm.outcome import job_outcome
from orchestrator.slurm.parse import JobInfo
from orchestrator.slurm.segments import Segments
from orchestrator.slurm.spares import SlurmSpares, job_dir_of
from orchestrator.supervise import Supervisor


class Ended(Protocol):
    """What of the follower (follow.py) the next job is decided from."""

    job: SlurmJob
    job_id: int
    info: JobInfo
    hosts: list[str]
    sup: Supervisor | None
    batch: RankFile
    base: dict
    segments: Segments
    spares: SlurmSpares | None
    submit: Callable[[SlurmJob, int], int] | None
    first_job_dir: str | None
    regrow: SlurmRegrow | None

    def note(self, text: str) -> None: ...

    def write_status(self) -> None: ...


def next_job(f: Ended, number: int) -> tuple[SlurmJob, int] | None:
    """Submit job `number` of the run after `f`'s job ended, noting why; None: the run
    ends with this job (its closing summary says why)."""
    ended = (f.job_id, f.info)
    back = f.regrow.take() if f.regrow is not None else []
    failure = f.spares.failure(*ended, f.hosts) if f.spares is not None else None
    if failure is not None:
        assert f.spares is not None
        if f.spares.after(f.job).goes_on:  # else the closing summary says it
            outcome = job_outcome(*ended, f.sup, None, Path(f.batch.path))
            f.note(outcome.summary.splitlines()[0])
        new = f.spares.replace(f.job, f.hosts, *failure, number, f.note)
        if new is None:
            return None
        f.base.update(**f.spares.status())
        f.segments.resubmitted(new[1], failure[1], new[0].nnodes)
        return new
    if back and f.regrow is not None:  # stopped at a checkpoint to grow (grow_back.py)
        return f.regrow.submit(f, back, number)
    if f.segments.carry_on() and f.submit is not None:
        job = replace(f.job, job_dir=job_dir_of(f.first_job_dir, number))
        new = job, f.submit(job, number)
        f.note(f.segments.resubmitted(new[1]))
        return new
    return None
