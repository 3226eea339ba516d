"""A SLURM run's attempts: the jobs it took one after another, how each ended, and whether
the run goes on in a next one.

A job that reaches its time limit (TIMEOUT), whose ranks stopped on the time limit's warning
(`attempt<restart>/warning` written by the script, and not every rank exited 0), or that a
higher-priority job preempted (PREEMPTED; with PreemptMode=REQUEUE SLURM requeues it
itself, and the follower follows it into its next start) is carried on: `orchestrator
launch` submits the same job again (same run id and command, a new job id), up to
--max-resubmits times; the program resumes from its checkpoint. A job cancelled (scancel,
`orchestrator stop`, Ctrl-C) is never carried on; a node failure is --spares' business
(orchestrator.slurm.recovery.spares) and --min-nodes' (orchestrator.slurm.recovery.shrink: the next
job on fewer nodes; orchestrator.slurm.recovery.grow_back: on more again, a job stopped at a
checkpoint ends `grow`; each attempt keeps its job's node count). ENDINGS is the table, first match
wins.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.backends.scheduler_states import SchedulerState
from orchestrator.record.runs import now_iso
from orchestrator.record.world import AttemptWorld, fewer_nodes_line
from orchestrator.slurm.control.parse import slurm_state
from orchestrator.supervise import Outcome

WARNING_FILE = "warning"  # in the job folder's attempt<restart>/: "USR1 <epoch seconds>"
CARRIED = ("time-limit", "preempted")  # endings after which the run goes on

# (ending, when it applies: (the job's state, warned, every rank exited 0), in words)
ENDINGS: tuple[tuple[str, Callable[[SchedulerState, bool, bool], bool], str], ...] = (
    (
        "cancelled",
        lambda s, w, ok: s == SchedulerState.CANCELLED,
        "cancelled (scancel, orchestrator stop)",
    ),
    (
        "time-limit",
        lambda s, w, ok: s in (SchedulerState.TIME_LIMIT, SchedulerState.DEADLINE),
        "ended by its time limit",
    ),
    (
        "preempted",
        lambda s, w, ok: s == SchedulerState.PREEMPTED,
        "preempted by a higher-priority job",
    ),
    (
        "node-failure",
        lambda s, w, ok: s in (SchedulerState.NODE_FAILED, SchedulerState.BOOT_FAILED),
        "a node failed",
    ),
    ("time-limit", lambda s, w, ok: w and not ok, "its ranks stopped on the time limit's warning"),
    ("completed", lambda s, w, ok: s == SchedulerState.SUCCEEDED, "completed"),
    ("failed", lambda s, w, ok: True, "failed"),
)


def ending(state: str, warned: bool, ranks_ok: bool) -> tuple[str, str]:
    """(ending, in words) of a job that ended in SLURM state `state` (its word)."""
    said = slurm_state(state)
    for kind, applies, words in ENDINGS:
        if applies(said, warned, ranks_ok):
            return kind, words
    raise AssertionError("the last row of ENDINGS applies to every job")


def read_warning(path: Path) -> tuple[str, float] | None:
    """The warning file: (signal name, when it came), or None when it never came."""
    try:
        name, when = path.read_text().split()[:2]
        return name, float(when)
    except (OSError, ValueError):
        return None


@dataclass
class JobAttempt:
    """One job of the run (a requeued job starts a new attempt under the same id)."""

    number: int
    job_id: int
    submitted_at: float
    running_at: float | None = None
    warned_at: float | None = None
    warning: str = ""  # "SIGUSR1 for the time limit" / "... for a preemption"
    ended_at: float | None = None
    slurm_state: str | None = None
    ending: str | None = None  # a row of ENDINGS, or "requeued"
    why: str = ""
    next: str = ""  # "resubmitted as job N", "requeued by SLURM"
    nodes: int = 0  # the nodes the job asked for (fewer after a node lost, --min-nodes)
    hosts: tuple[str, ...] = ()  # the nodes it ran on, in node-rank order
    ranks: int = 0  # its world size

    def ran(self, hosts: tuple[str, ...], ranks: int) -> None:
        """Its job runs (from now), on `hosts` with `ranks` ranks; said once."""
        if self.running_at is None:
            self.running_at, self.hosts, self.ranks = time.time(), hosts, ranks

    def warn(self, when: float | None, warning: str = "") -> None:
        """Its ranks were sent the warning at `when` (None: not, after all)."""
        self.warned_at = when
        if when is not None:
            self.warning = warning

    def end(self, state: str | None, ending: str, why: str) -> None:
        """Its job ended now in SLURM's `state`: `ending` (a row of ENDINGS), in words."""
        self.ended_at, self.slurm_state = time.time(), state
        self.ended_as(ending, why)

    def ended_as(self, ending: str, why: str) -> None:
        self.ending, self.why = ending, why

    def then(self, next_: str) -> None:
        """What followed it: "resubmitted as job N", "requeued by SLURM"."""
        self.next = next_

    def to_dict(self) -> dict:
        return {
            "attempt": self.number,
            "job_id": self.job_id,
            "nodes": self.nodes or None,
            "submitted_at": now_iso(self.submitted_at),
            "running_at": now_iso(self.running_at) if self.running_at else None,
            "warned_at": now_iso(self.warned_at) if self.warned_at else None,
            "warning": self.warning or None,
            "ended_at": now_iso(self.ended_at) if self.ended_at else None,
            "slurm_state": self.slurm_state,
            "ended": self.ending,
            "why": self.why or None,
            "next": self.next or None,
        }


def describe_job_attempt(entry: dict) -> str:
    """One attempt as status.json holds it, in words (times of day in UTC)."""

    def clock(key: str) -> str:
        return entry[key][11:19] if entry.get(key) else "?"

    ran = f" ran {clock('running_at')}-{clock('ended_at')}" if entry.get("running_at") else ""
    state = f" ({entry['slurm_state']})" if entry.get("slurm_state") else ""
    how = entry.get("why") or ("running" if entry.get("running_at") else "queued")
    warned = f"; {entry['warning']} at {clock('warned_at')}" if entry.get("warned_at") else ""
    then = f"; {entry['next']}" if entry.get("next") else ""
    nodes = f" on {entry['nodes']} node(s)" if entry.get("nodes") else ""
    return f"{entry['attempt']}. job {entry['job_id']}{nodes}{ran}: {how}{state}{warned}{then}"


class JobAttempts:
    """The attempts of one run, and how many resubmissions are left."""

    def __init__(self, job_id: int, max_resubmits: int, nodes: int = 0) -> None:
        self.given = self.left = max_resubmits
        self.entries = [JobAttempt(1, job_id, time.time(), nodes=nodes)]
        self.preempted_seen = False  # SLURM said PreemptTime for the attempt now followed

    @property
    def current(self) -> JobAttempt:
        return self.entries[-1]

    def running(self, hosts: list[str] | tuple[str, ...] = (), ranks: int = 0) -> None:
        """The job of the current attempt runs, on `hosts` with `ranks` ranks."""
        self.current.ran(tuple(hosts), ranks)

    def warned(self, signal_name: str, when: float, preempted: bool) -> str:
        """The script passed the warning on to the ranks; the console's line."""
        attempt = self.current
        cause = "a preemption" if preempted else "the time limit"
        attempt.warn(when, f"SIG{signal_name} for {cause}")
        self.preempted_seen = self.preempted_seen or preempted
        return (
            f"SLURM job {attempt.job_id}: SIG{signal_name} to every rank for {cause} "
            "(the ranks save a checkpoint and stop)"
        )

    def warned_to(self, warning: str) -> None:
        """The ranks were sent the warning now for `warning`'s reason (growing back,
        grow_back.py): their ends from now on are stops."""
        self.current.warn(time.time(), warning)

    def unwarned(self) -> None:
        """No rank took the warning: the attempt is as if it never went out."""
        self.current.warn(None)

    def restore(
        self, entries: list[JobAttempt], given: int, left: int, preempted_seen: bool
    ) -> None:
        """The attempts as a follower before this one left them (following/handover.py)."""
        self.entries, self.given, self.left = entries, given, left
        self.preempted_seen = preempted_seen

    def preempted(self) -> None:
        """SLURM says a higher-priority job preempted the job now followed (PreemptTime)."""
        self.preempted_seen = True

    def ended(self, state: str, ranks_ok: bool) -> str:
        """The job of the current attempt ended in `state` (SLURM's word, which the attempt
        keeps): its ending (a row of ENDINGS)."""
        attempt = self.current
        kind, words = ending(state, attempt.warned_at is not None, ranks_ok)
        timed_out = slurm_state(state) == SchedulerState.TIME_LIMIT
        if self.preempted_seen and kind in ("time-limit", "failed") and not timed_out:
            # The ranks stopped on the preemption's signal (or SIGTERM), and the script
            # ended before SLURM could requeue the job.
            kind, words = "preempted", "preempted by a higher-priority job"
        attempt.end(state, kind, words)
        return kind

    def requeued(self, state: str, reason: str) -> str:
        """SLURM requeued the job (same id): a new attempt; the console's line."""
        old = self.current
        kind = "preempted" if self.preempted_seen else "requeued"
        old.end(
            state,
            kind,
            "preempted by a higher-priority job"
            if kind == "preempted"
            else f"requeued ({reason or state})",
        )
        old.then("requeued by SLURM")
        self._begin(old.job_id, old.nodes)
        return f"attempt {self.current.number}: SLURM job {old.job_id} {old.why}; requeued by SLURM"

    def carry_on(self) -> bool:
        """Whether the ended attempt's job is to be submitted again (and one more may be)."""
        return self.current.ending in CARRIED and self.left > 0

    def resubmitted(
        self, new_id: int, why: str = "", nodes: int = 0, kind: str = "node-failure"
    ) -> str:
        """The job was submitted again as `new_id` (on `nodes` nodes; 0: as many as
        before): a new attempt; the console's line. `why`: a node failure (--spares,
        --min-nodes) or a growth back (`kind` "grow", grow_back.py) says its own."""
        old = self.current
        nodes = nodes or old.nodes
        other = f" on {nodes} node(s)" if old.nodes and nodes != old.nodes else ""
        old.then(f"resubmitted as job {new_id}{other}")
        if why:
            old.ended_as(kind, why)
        elif old.ending in CARRIED:
            self.left -= 1
        self._begin(new_id, nodes)
        return (
            f"attempt {self.current.number}: SLURM job {new_id} submitted, after job "
            f"{old.job_id} {old.why}"
        )

    def _begin(self, job_id: int, nodes: int) -> None:
        self.entries.append(JobAttempt(len(self.entries) + 1, job_id, time.time(), nodes=nodes))
        self.preempted_seen = False

    def world(self) -> list[AttemptWorld]:
        """The nodes the run ran on over time, one entry per job that ran (status.json's
        `world`, as over SSH: orchestrator.record.world)."""
        world, why = [], "launch"
        for attempt in self.entries:
            if attempt.hosts:
                world.append(
                    AttemptWorld(
                        attempt.number,
                        attempt.hosts,
                        attempt.ranks,
                        attempt.submitted_at,
                        why,
                        attempt.running_at,
                    )
                )
            why = f"after job {attempt.job_id}: {attempt.why}"
        return world

    def status(self) -> dict:
        """The attempts part of status.json (`attempt`: the current one's number, as over
        SSH), and the world they ran on."""
        return {
            "attempt": self.current.number,
            "attempts": [s.to_dict() for s in self.entries],
            "resubmits_left": self.left,
            "world": [w.to_dict() for w in self.world()],
        }

    def amend(self, outcome: Outcome) -> Outcome:
        """The final outcome with the attempts, when there were several, and why the last
        was not carried on when it could have been."""
        lines = [outcome.summary] if outcome.summary else []
        last = self.current
        if last.ending in CARRIED and self.left == 0:
            lines.append(
                f"not submitted again: --max-resubmits {self.given} used up; the run's "
                "checkpoint is where a new launch with --resume goes on"
            )
            if outcome.exit_code != 0:
                outcome = replace(outcome, exit_code=124)
        if len(self.entries) > 1:
            lines.append(f"carried across {len(self.entries)} attempt(s):")
            lines += [f"  {describe_job_attempt(s.to_dict())}" for s in self.entries]
        fewer = fewer_nodes_line(self.world(), time.time())
        if fewer:
            lines.append(fewer)
        return replace(outcome, summary="\n".join(lines))
