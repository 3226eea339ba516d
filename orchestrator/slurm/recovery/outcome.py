"""How a followed SLURM job ended: SLURM's last word on the job, and the ranks' own.

A job that SLURM ended itself (time limit, scancel, a failed node, ...) says so first, with
the first failing rank when there is one; a job whose ranks ran says what they did; a job
that failed before any node started its ranks shows the end of the batch script's output.
"""

from __future__ import annotations

import signal
from pathlib import Path

from orchestrator.backends.scheduler_states import SchedulerState
from orchestrator.console.reading import last_lines_of
from orchestrator.record.states import RunState
from orchestrator.slurm.control.parse import JobInfo
from orchestrator.supervise import Outcome, Supervisor, describe_exit

JOB_ENDINGS = {
    SchedulerState.TIME_LIMIT: "it reached its time limit (--time)",
    SchedulerState.CANCELLED: "it was cancelled (scancel)",
    SchedulerState.NODE_FAILED: "a node of it failed",
    SchedulerState.PREEMPTED: "it was preempted",
    SchedulerState.OUT_OF_MEMORY: "it ran out of memory",
    SchedulerState.DEADLINE: "it reached its deadline",
    SchedulerState.BOOT_FAILED: "a node failed to boot",
}


def job_outcome(
    job_id: int,
    info: JobInfo,
    sup: Supervisor | None,
    interrupted_by: int | None,
    batch_output: Path,
    on_node: str | None = None,
) -> Outcome:
    """The outcome of job `job_id`, ended as `info` says; nodes that never reported their
    end are settled in `sup` (SLURM ended them before their script could say so).
    `on_node`: the batch script's output is there on the batch node, not `batch_output`."""
    if sup is not None:
        sup.ended_unreported(f"ended by SLURM (job {info.state})")
        if interrupted_by is not None:
            sup.interrupted(interrupted_by)
    ranks = sup.outcome() if sup is not None else None
    job_code = info.exit_code if info.exit_code else 1
    name = f"SLURM job {job_id}"
    if interrupted_by is not None:
        signame = signal.Signals(interrupted_by).name
        stopped = f"stopped by {signame}: {name} cancelled"
        return Outcome(RunState.STOPPED, 128 + interrupted_by, stopped)
    if ranks is not None and ranks.state in (RunState.HUNG, RunState.UNREACHABLE):
        return ranks  # found hung or unreachable, then cancelled: that is how it ended
    said = info.scheduler_state
    if said == SchedulerState.SUCCEEDED and (ranks is None or ranks.state == RunState.SUCCEEDED):
        return ranks or Outcome(RunState.SUCCEEDED, 0)  # the ranks' says which restarts it took
    if said in JOB_ENDINGS:
        summary = f"job ended: {name} ended {info.state}: {JOB_ENDINGS[said]}"
        if ranks is not None and ranks.summary:
            summary += "\n" + ranks.summary
        ended = RunState.STOPPED if said == SchedulerState.CANCELLED else RunState.FAILED
        return Outcome(ended, job_code, summary)
    started = sup is not None and any(n.started_at is not None for n in sup.nodes)
    unsettled = said == SchedulerState.UNKNOWN
    if ranks is not None and started and (ranks.state != RunState.SUCCEEDED or unsettled):
        return ranks
    read = [] if on_node else last_lines_of(batch_output, 20)
    tail = [line.decode(errors="replace").rstrip("\n") for line in read]
    lines = [
        f"job failed: {name} ended {info.state} with {describe_exit(job_code)}"
        + (" and no rank failed" if started else " before any node started its ranks")
    ]
    if on_node:
        lines += [f"the batch script's output is on the batch node: {on_node}"]
    elif not started and not batch_output.exists():  # SLURM could not write it there
        lines += [
            f"SLURM wrote no {batch_output.name} into the run folder: if --run-dir is not on "
            "a file system the nodes share, give --job-dir DIR (a folder on the nodes)"
        ]
    if tail:
        lines += [f"last {len(tail)} line(s) of {batch_output}:"]
        lines += [f"  {line}" for line in tail]
    return Outcome(RunState.FAILED, job_code, "\n".join(lines))
