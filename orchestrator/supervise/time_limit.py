"""The time limit of an SSH or local run and the warning signal ahead of it (`launch --time
LIMIT [--signal USR1@SECONDS]`, parsed in orchestrator/plan/deadline.py).

`WarningClock` keeps both on one clock: the controller's wall clock, from the run's start
(status.json's `started_at`, which the closing "after N s" counts from too; with --spares,
the first attempt's). `warning_s` before the limit it has the agent of every node whose
ranks run send the signal to each rank's own process (`signal USR1`; torchrun would not pass
SIGUSR1 on to its workers, so the agent signals them itself: agent/limit_warning.py `warn_ranks`),
if the process catches it (its default action would end it; one that does not runs on to
the limit, as under SLURM, where it inherits "ignore"). Each agent answers `G SIG T SENT
SKIPPED`, T its own clock just before its first signal: a rank of that node whose exit time
(same clock) is not before T ended on the warning. That is not a failure, and it stops no
other rank: they were warned too and may still be saving (a save ends a rank before its
peers when their shards differ), so the run stops only once the ranks left are those that do
not catch the warning (`may_save`); the limit bounds the wait. The verdict is "the ranks
stopped on the time limit's warning" (failed, 124: the work is not done). At the limit the
supervisor stops what still runs at once (failed, 124), and the ranks still running then are
named in the summary.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from enum import Enum
from typing import Protocol

from orchestrator.agent.protocol import signal_command
from orchestrator.hostlist import name_ranks
from orchestrator.plan.deadline import Deadline
from orchestrator.record.runs import now_iso
from orchestrator.record.states import NodePhase, RankPhase
from orchestrator.supervise.state import NodeState, RankState

SHOWN_RANKS = 8  # a summary names this many ranks, then says how many more


class Cause(Enum):
    """What the warning signal was sent for; `WarningClock.the_warning` words it, for the
    console's line and the run's stop reason, over SSH and under SLURM alike."""

    TIME_LIMIT = "time limit"  # --time's warning (SSH: this clock; SLURM: --signal)
    PREEMPTION = "preemption"  # SLURM's signal to a preempted job's ranks
    CHECKPOINT = "checkpoint"  # asked with no limit behind it: growing back (checkpoint())


class Session(Protocol):
    index: int

    def send(self, line: str, may_skip: bool = False) -> None: ...


class Run(Protocol):
    """What the clock needs of the supervisor."""

    sessions: Sequence[Session]
    ranks: dict[int, RankState]

    @property
    def stopping(self) -> bool: ...

    def running_ranks(self) -> set[int]: ...

    def begin_stop(self, grace: float, reason: str) -> None: ...


class Notes(Protocol):
    def note(self, text: str) -> None: ...

    def node_note(self, host: str, text: str) -> None: ...


class WarningClock:
    """When to warn the ranks and when the limit is reached; what the warning did."""

    def __init__(
        self,
        limit_s: float | None,
        warning: tuple[str, float] | None,  # ("USR1", seconds before the limit)
        started_wall: float,  # when the limit's time began (the controller's wall clock)
    ) -> None:
        self.limit_s = limit_s
        self.signal_name, self.warning_s = (
            warning if warning is not None and limit_s is not None else (None, None)
        )
        self.started_wall = started_wall
        self.sent_at: float | None = None  # when the warning went out (the controller's clock)
        self.before_limit_s = 0  # how long before the limit it went out (whole seconds)
        self.signalled: dict[int, float] = {}  # node -> its agent's clock before its signals
        self.ranks_signalled: set[int] = set()  # the ranks the agents found and signalled
        self.not_catching: set[int] = set()  # ranks found that do not catch it: not sent it
        self.at_limit: list[int] | None = None  # the ranks still running at the limit
        self.ended_run = False  # the run's stop began with a rank that ended on the warning
        self.cause = Cause.TIME_LIMIT  # what the warning is for
        self.why = ""  # with Cause.CHECKPOINT, why one is asked ("growing to 4 nodes")

    @classmethod
    def of(cls, deadline: Deadline, started_wall: float) -> WarningClock:
        """The clock of `launch --time/--signal` (plan/deadline.py), from `started_wall`."""
        signal, seconds = deadline.signal_name, deadline.warning_s
        warning = (signal, seconds) if signal is not None and seconds is not None else None
        return cls(deadline.limit_s, warning, started_wall)

    def left(self, now: float) -> float:
        """Seconds to the limit (inf: none)."""
        return math.inf if self.limit_s is None else self.started_wall + self.limit_s - now

    def wait(self, now: float) -> float:
        """Seconds until the clock has something to do (inf: nothing more)."""
        if self.limit_s is None or self.at_limit is not None:
            return math.inf
        ahead = self.warning_s if self.warning_s is not None and self.sent_at is None else 0
        return max(0.0, self.left(now) - ahead)

    def tick(self, run: Run, notes: Notes, now: float) -> bool:
        """Send the warning once it is due (to the ranks running then); once the limit is
        past, stop the run at once (the ranks still running are kept for the end): True."""
        left = self.left(now)
        if self.warning_s is not None and self.sent_at is None and left <= self.warning_s:
            self.send(run, notes, now, left)
        if left >= 0:
            return False
        if self.at_limit is None:
            self.at_limit = sorted(run.running_ranks())
            run.begin_stop(0, f"time limit of {self.limit_s:g} s reached")
        return True

    def send(self, run: Run, notes: Notes, now: float, left: float) -> None:
        """`signal SIG` to every node with a running rank; not while the run stops, and not
        before a rank runs (a start slower than the time to the warning)."""
        sent = self._signal(run)
        if sent is None:
            return
        self.sent_at, self.before_limit_s = now, max(0, round(left))
        notes.note(
            f"time limit in {self.before_limit_s} s: SIG{self.signal_name} to {sent[0]} "
            f"rank(s) on {sent[1]} node(s)"
        )

    def checkpoint(self, run: Run, notes: Notes, now: float, why: str) -> bool:
        """The warning signal now, with no limit behind it: the ranks save a checkpoint and
        end (--min-nodes: the run grows at it). SIGUSR1 unless --signal chose another.
        False while no rank runs yet (asked again later)."""
        if self.sent_at is not None:
            return True
        self.signal_name = self.signal_name or "USR1"
        sent = self._signal(run)
        if sent is None:
            return False
        self.sent_at = now
        self.warned_for(Cause.CHECKPOINT, why)
        notes.note(f"{why}: SIG{self.signal_name} to {sent[0]} rank(s) on {sent[1]} node(s)")
        return True

    def signal_known(self, name: str | None) -> None:
        """The warning's signal as the scheduler was told it (SLURM's --signal), unless the
        clock has one already."""
        self.signal_name = self.signal_name or name

    def unsent(self) -> None:
        """Forget a warning that no rank took (every rank found does not catch it yet: a
        program still starting): `checkpoint` sends it again."""
        self.sent_at = None
        self.not_catching.clear()
        self.signalled.clear()

    def warned_for(self, cause: Cause, why: str = "") -> None:
        """What the warning went out for (SLURM's signal: the time limit or a preemption)."""
        self.cause, self.why = cause, why

    def the_warning(self) -> str:
        """The warning as the console names it: "the time limit's warning", "the
        preemption's warning", "the warning for growing to 4 nodes at a checkpoint"."""
        if self.cause is Cause.CHECKPOINT:
            return f"the warning for {self.why or 'a checkpoint'} at a checkpoint"
        return f"the {self.cause.value}'s warning"

    def _signal(self, run: Run) -> tuple[int, int] | None:
        """`signal SIG` to every node with a running rank: (ranks, nodes), or None."""
        ranks = sorted(run.running_ranks())
        if run.stopping or not ranks:
            return None
        nodes = {run.ranks[rank].node for rank in ranks}
        for session in list(run.sessions):
            if session.index in nodes:
                session.send(signal_command(self.signal_name))
        return len(ranks), len(nodes)

    def signalled_on(self, node: NodeState, notes: Notes, at: str, sent: str, skipped: str) -> None:
        """The agent's answer (G): when, in its clock, the ranks it sent the signal to and
        those that do not catch it ("0,1"; "-": none)."""
        self.signalled[node.index] = float(at)
        self.ranks_signalled.update(int(r) for r in sent.split(",") if r.isdigit())
        missed = {int(r) for r in skipped.split(",") if r.isdigit()}
        self.not_catching |= missed
        if missed:  # said alike on every node, so that the console folds it
            notes.node_note(
                node.host,
                f"{len(missed)} rank(s) do not catch SIG{self.signal_name}: not sent it "
                "(they run on to the limit)",
            )

    def after(self, node: int, node_time: float) -> bool:
        """Whether a rank of `node` that ended at `node_time` (its clock) ended after the
        warning reached that node. A whole second (bash < 5 writes no fraction) counts from
        the second the warning went out."""
        sent = self.signalled.get(node)
        if sent is None:
            return False
        return node_time >= (math.floor(sent) if node_time.is_integer() else sent)

    def may_save(self, running: Iterable[RankState]) -> bool:
        """Whether one of the `running` ranks may still be saving on the warning: all but
        those its node's agent found not to catch it (a node that has not answered yet
        may have sent it to all its ranks)."""
        return any(rank.rank not in self.not_catching for rank in running)

    def ended_on_it(
        self, ranks: Iterable[RankState], nodes: Iterable[NodeState], stopping: bool
    ) -> bool:
        """Warned, and every rank ended before the limit, each that did not succeed after
        the warning; no stop but the one a rank that ended on it began, no node lost."""
        return (
            self.sent_at is not None
            and self.at_limit is None
            and (self.ended_run or not stopping)
            and all(rank.state in (RankPhase.SUCCEEDED, RankPhase.STOPPED) for rank in ranks)
            and not any(node.state == NodePhase.LOST for node in nodes)
        )

    def status(self) -> dict:
        """status.json's `time_limit_s` and, once sent, `warning`."""
        if self.limit_s is None:
            return {}
        found: dict = {"time_limit_s": self.limit_s}
        if self.sent_at is not None:
            found["warning"] = {
                "signal": self.signal_name,
                "sent_at": now_iso(self.sent_at),
                "before_limit_s": self.before_limit_s,
                "ranks_signalled": len(self.ranks_signalled),
                "ranks_not_catching_it": sorted(self.not_catching),
            }
        if self.at_limit is not None:
            found["running_at_limit"] = self.at_limit
        return found

    def warned(self) -> str:
        """ "SIGUSR1 10 s before the 40 s limit"."""
        if self.limit_s is None or self.cause is not Cause.TIME_LIMIT:  # no limit of ours
            return f"SIG{self.signal_name}"
        return f"SIG{self.signal_name} {self.before_limit_s} s before the {self.limit_s:g} s limit"

    def ended_summary(self, ranks: dict[int, RankState], succeeded: bool) -> str:
        """The summary of a run whose every rank ended after the warning, before the limit
        (those that do not catch it: in the stop that the others' exits began)."""
        if succeeded:
            return (
                f"{self.the_warning()} went out ({self.warned()}); every rank ended "
                "with exit code 0 before the limit"
            )
        deaf = sorted(self.not_catching & set(ranks))
        hosts = {rank: state.host for rank, state in ranks.items()}
        ended = (
            "every rank exited after it"
            if not deaf
            else f"{len(ranks) - len(deaf)} rank(s) exited after it, and the run was stopped: "
            f"{len(deaf)} do not catch it ({name_ranks(deaf, hosts, listed=SHOWN_RANKS)})"
        )
        return (
            f"stopped on {self.the_warning()} ({self.warned()}): {ended}; a program "
            "that saves a checkpoint on it resumes from there when launched again (the "
            "bundled trainer: --checkpoint-dir DIR --resume)"
        )

    def limit_summary(self, ranks: dict[int, RankState]) -> str:
        """What the summary of a run the limit stopped adds: the warning, and which ranks
        still ran at the limit."""
        if self.sent_at is not None:
            warning = f"the warning went out {self.before_limit_s} s before it"
        elif self.signal_name is not None:
            warning = "no rank ran when the warning was due"
        else:
            warning = "no warning signal (--signal none)"
        if not self.at_limit:
            return f"{warning}; no rank was running at the limit"
        hosts = {rank: state.host for rank, state in ranks.items()}
        shown = name_ranks(self.at_limit, hosts, listed=SHOWN_RANKS)
        return f"{warning}; still running at the limit (stopped then): {shown}"
