"""The run's next SLURM job once one has ended, as orchestrator.attempts.next_attempt
decides it for every backend: after a node failure, on a spare (--spares) or on the nodes
left (--min-nodes; spares.py and shrink.py carry it out); after the ranks stopped at a
checkpoint for a lost node back, on more nodes (grow_back.py); after the ranks stopped at a
checkpoint to take out a slow node (supervise/straggler_swap.py), as after its failure; after
a time limit or a preemption, the same job again (job_attempts.py); or none, and the run
ends."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.attempts.next_attempt import AttemptEnd, Next, next_attempt
from orchestrator.slurm.batch.job import SlurmJob
from orchestrator.slurm.control.parse import JobInfo
from orchestrator.slurm.recovery.grow_back import GROW, SlurmRegrow, grown
from orchestrator.slurm.recovery.job_attempts import JobAttempts
from orchestrator.slurm.recovery.outcome import job_outcome
from orchestrator.slurm.recovery.spares import SlurmSpares, job_dir_of
from orchestrator.supervise import Supervisor
from orchestrator.supervise.state import NodeFault

SLOW = "slow"  # the ending of a job stopped at a checkpoint to take out a slow node


@dataclass(frozen=True)
class EndedJob:
    """The job that ended, as its follower saw it last."""

    job: SlurmJob
    job_id: int
    info: JobInfo
    hosts: list[str]  # the nodes it ran on ([] if it never ran)
    sup: Supervisor | None  # its last attempt's, if one ran
    batch_output: Path


@dataclass(frozen=True)
class Resubmitting:
    """What the run submits its next job with, and says it through."""

    attempts: JobAttempts
    submit: Callable[[SlurmJob, int], int] | None  # the job as the run's job number N: its id
    first_job_dir: str | None
    note: Callable[[str], None]  # a line on the console (and in the combined log)
    status: Callable[[dict], None]  # what is added to the run's status.json
    spares: SlurmSpares | None = None
    regrow: SlurmRegrow | None = None

    def warned_for_slow(self, sup: Supervisor) -> bool:
        """Whether the warning went out now to take out a slow node: kept in the attempt,
        so the ranks' ends from now on are stops, as for growing back (grow_back.py)."""
        slow, attempt = sup.swap_due, self.attempts.current
        if slow is None or sup.deadline.sent_at is None or attempt.warned_at is not None:
            return False
        self.attempts.warned_to(f"SIG{sup.deadline.signal_name} to take out slow {slow.host}")
        return True


def next_job(ended: EndedJob, run: Resubmitting, number: int) -> tuple[SlurmJob, int] | None:
    """Submit job `number` of the run after `ended`, noting why; None: the run ends with
    this job (its closing summary says why). What follows is decided once for every
    backend (attempts/next_attempt.py); here it is carried out."""
    job, spares = ended.job, run.spares
    back = run.regrow.take() if run.regrow is not None else []
    slow = slow_node(ended, run)
    if slow is not None and spares is not None:  # stopped at a checkpoint to take it out
        failure: tuple[str, str] | None = spares.slow_node(slow)
        run.note(f"SLURM job {ended.job_id} stopped at its checkpoint to take out slow {slow.host}")
    else:
        failure = spares.failure(ended.job_id, ended.info, ended.hosts) if spares else None
    if failure is not None:
        assert spares is not None
        step = spares.after(job)  # a node lost: a spare, the nodes left, or the end
        if step.goes_on and slow is None:  # else the closing summary says it
            outcome = job_outcome(ended.job_id, ended.info, ended.sup, None, ended.batch_output)
            run.note(outcome.summary.splitlines()[0])
        new = spares.replace(job, ended.hosts, *failure, number, run.note)
        if new is None:
            return None
        run.status(spares.status())
        kind = SLOW if slow is not None else "node-failure"
        run.attempts.resubmitted(new[1], failure[1], new[0].nnodes, kind)
        return new
    # Stopped to grow: unless it ended otherwise first (completed or cancelled).
    grew = back and run.attempts.current.ending not in ("completed", "cancelled")
    facts = AttemptEnd(job.nnodes, back=len(back) if grew else 0, resubmit=run.attempts.carry_on())
    step = next_attempt(facts)
    if run.submit is None or not step.goes_on:
        return None
    if step is Next.GROW:  # stopped at a checkpoint to grow (grow_back.py)
        return _grown(job, run, back, number)
    again = replace(job, job_dir=job_dir_of(run.first_job_dir, number))
    new = again, run.submit(again, number)
    run.note(run.attempts.resubmitted(new[1]))
    return new


def slow_node(ended: EndedJob, run: Resubmitting) -> NodeFault | None:
    """The slow node `ended` stopped at its checkpoint for (supervise/straggler_swap.py),
    unless the job ended otherwise first (completed or cancelled)."""
    slow = ended.sup.swap_due if ended.sup is not None else None
    if slow is None or run.attempts.current.ending in ("completed", "cancelled"):
        return None
    return slow


def _grown(
    job: SlurmJob, run: Resubmitting, back: list[str], number: int
) -> tuple[SlurmJob, int] | None:
    """After the job stopped for `back` ended by that stop: the job on the larger count,
    submitted as the run's job number `number`."""
    assert run.submit is not None
    new = grown(job, back, job_dir_of(run.first_job_dir, number))
    why = f"stopped at a checkpoint to grow to {new.nnodes} nodes ({', '.join(back)} back)"
    new_id = run.submit(new, number)
    run.note(run.attempts.resubmitted(new_id, why, new.nnodes, GROW))
    run.note(
        f"run {new.run_id}: SLURM job {new_id} submitted (attempt {number}) on "
        f"{new.nnodes} node(s), with {', '.join(back)} again"
    )
    return new, new_id
