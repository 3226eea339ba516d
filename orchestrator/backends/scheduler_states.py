"""An attempt's state as its scheduler reports it, in the orchestrator's own words.

A scheduler (SLURM) names a job's state in its own words (PENDING, COMPLETING, NODE_FAIL,
...); its parser translates them into these, in one table beside it (slurm/control/parse.py's
`SLURM_STATES`), and the code that decides on a job decides on these alone. The scheduler's
own word is kept beside (`JobInfo.state`) for what the console and the record show.
"""

from __future__ import annotations

from enum import Enum


class SchedulerState(str, Enum):
    """What an attempt's scheduler says the attempt is doing, or how it ended."""

    QUEUED = "queued"  # waiting for its nodes (SLURM: PENDING)
    REQUEUED = "requeued"  # put back in the queue by the scheduler, the same job again
    STARTING = "starting"  # its nodes are given and being readied (CONFIGURING)
    RUNNING = "running"
    ENDING = "ending"  # its processes are ending; it still holds nodes (COMPLETING)
    SUSPENDED = "suspended"  # paused on its nodes (SUSPENDED, STOPPED)
    OTHER = "other"  # a state no decision turns on (RESIZING, SIGNALING, ...), not ended
    SUCCEEDED = "succeeded"  # ran to its end, exit code 0 (COMPLETED)
    FAILED = "failed"  # ended otherwise: a nonzero exit, or a state no decision turns on
    CANCELLED = "cancelled"  # scancel, orchestrator stop
    TIME_LIMIT = "time-limit"  # reached its time limit (TIMEOUT)
    DEADLINE = "deadline"  # reached its deadline (--deadline)
    NODE_FAILED = "node-failed"  # a node of it failed (NODE_FAIL)
    BOOT_FAILED = "boot-failed"  # a node failed to boot (BOOT_FAIL)
    PREEMPTED = "preempted"  # a higher-priority job took its nodes
    OUT_OF_MEMORY = "out-of-memory"
    UNKNOWN = "unknown"  # the scheduler no longer knows the job: ended, how is not known

    @property
    def ended(self) -> bool:
        """The attempt has ended; the scheduler holds no process of it any more."""
        return self in _ENDED

    @property
    def on_nodes(self) -> bool:
        """The attempt's processes are on its nodes: running, or ending there."""
        return self in (SchedulerState.RUNNING, SchedulerState.ENDING)

    @property
    def waiting(self) -> bool:
        """In the queue: not yet started, or put back by the scheduler."""
        return self in (SchedulerState.QUEUED, SchedulerState.REQUEUED)

    def __str__(self) -> str:  # the word itself in messages, on every Python version
        return self.value


_ENDED = frozenset(
    {
        SchedulerState.SUCCEEDED,
        SchedulerState.FAILED,
        SchedulerState.CANCELLED,
        SchedulerState.TIME_LIMIT,
        SchedulerState.DEADLINE,
        SchedulerState.NODE_FAILED,
        SchedulerState.BOOT_FAILED,
        SchedulerState.PREEMPTED,
        SchedulerState.OUT_OF_MEMORY,
        SchedulerState.UNKNOWN,
    }
)
