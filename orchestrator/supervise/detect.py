"""Failure detection: from rank and node exits and silence, each node's and rank's state,
which of them failed first, whether a node was lost, and how the run ended, in words.

Deciding *that* the run must stop is here; stopping it is `stopping.Stopper`'s part.
The methods that see a failure return why the run must stop (or None).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from orchestrator.record.states import NodePhase, RankPhase, RunState
from orchestrator.supervise.restarts import Rounds, describe_restart
from orchestrator.supervise.state import (
    NodeFault,
    NodeState,
    Outcome,
    RankState,
    describe_exit,
    killed_from_outside,
    terminated,
)
from orchestrator.supervise.stopping import Stopper
from orchestrator.supervise.time_limit import WarningClock
from orchestrator.supervise.unreachable import NoAnswer
from orchestrator.supervise.verdict import FAULT_KINDS, ON_WARNING, Facts, verdict


@dataclass(frozen=True)
class Fault:
    """A failure that happened before the run was stopped (see Detector.faults)."""

    when: float  # the controller's clock
    kind: str  # one of verdict.FAULT_KINDS
    code: int | None
    subject: RankState | NodeState


class Sink(Protocol):
    def note(self, text: str) -> None: ...

    def last_lines(self, rank: int | None = None, node: int | None = None) -> list[str]: ...


class Detector:
    """Keeps every node's and rank's state from their reports; says who failed first."""

    def __init__(
        self,
        nodes: Sequence[NodeState],
        ranks: Sequence[RankState],
        sink: Sink,
        stopper: Stopper,
        *,
        stop_on_failure: bool = True,
        max_restarts: int = 0,
    ) -> None:
        self.nodes = list(nodes)
        self.ranks = {r.rank: r for r in ranks}
        self.sink = sink
        self.stopper = stopper
        self.stop_on_failure = stop_on_failure
        self.started_wall = time.time()
        # torchrun --max-restarts: a rank failing is a restart until its torchrun gives up
        # (its node script then fails); see restarts.py.
        self.max_restarts = max_restarts
        self.rounds = Rounds.empty()
        self.restarts_noted: set[int] = set()
        self.gave_up = False
        self.hang_summary: str | None = None
        self.unreachable_lines: list[str] = []  # each pair once; the first stopped the run
        self.unreachable_pairs: set[tuple[int, int]] = set()
        self.warning: WarningClock | None = None  # the time limit's (supervise/time_limit.py)

    # --- reports (every time in the controller's clock) -------------------------------

    def rank_exited(
        self,
        rank: int,
        code: int,
        when: float,
        after_stop: bool | None = None,
        warned: bool = False,
    ) -> str | None:
        """`after_stop`: the rank ended after its node had received the stop (its agent
        says so, in its own clock). Without that word (SLURM), `when` is compared with
        when the stop began, both in one clock. `warned`: it ended after its agent sent
        it the warning signal (the time limit's, a preemption's, or one for a checkpoint):
        asked to stop, so stopped, and the run stops."""
        state = self.ranks[rank]
        if (
            self.nodes[state.node].state == NodePhase.LOST
        ):  # what a lost node says later is not heard
            state.exit_code = code
            return None
        state.exit_code, state.ended_at = code, when
        stopped = (after_stop if after_stop is not None else self.stopper.caused(when)) or warned
        failed = code != 0 and not stopped
        if self.max_restarts:
            round_, _ = self.rounds.ended(state, code, when, failed)
            if failed:
                state.state = RankPhase.RESTARTING
            self.note_restart(round_)
            if failed:
                return None
        if code == 0:
            state.state = RankPhase.SUCCEEDED
        elif stopped:
            state.state = RankPhase.STOPPED
            if warned and self.warning is not None and not self.stopper.stopping:
                return self.ended_on_warning(state, code)
        else:
            state.state = RankPhase.FAILED
            if self.stop_on_failure and not self.stopper.stopping:
                self.sink.note(
                    f"rank {rank} on {state.host} failed with "
                    f"{describe_exit(code)}; stopping the run on every node"
                )
                return f"rank {rank} on {state.host} failed"
        return None

    def ended_on_warning(self, state: RankState, code: int) -> str | None:
        """A rank ended after the warning: its save is done. The other ranks were warned too
        and may still be saving, so nothing stops them while one that catches the signal
        runs (the limit, or SLURM's grace, bounds the wait); once only ranks that do not
        catch it are left, the run stops: the reason, or None while ranks still save."""
        assert self.warning is not None
        self.sink.note(
            f"rank {state.rank} on {state.host} ended with {describe_exit(code)} after "
            f"{self.warning.the_warning()}"
        )
        left = [
            r for r in self.ranks.values() if r.state in (RankPhase.STARTING, RankPhase.RUNNING)
        ]
        if not left or self.warning.may_save(left):
            return None
        self.warning.ended_run = True
        self.sink.note(
            f"the {len(left)} rank(s) left do not catch the warning; stopping the run on every node"
        )
        return f"rank {state.rank} on {state.host} ended on {self.warning.the_warning()}"

    def note_restart(self, round_: int) -> None:
        """Once every rank has ended the round (so the first to fail in it is known, not
        merely the first reported), say which rank's failure made torchrun restart."""
        cause = self.rounds.causes.get(round_)
        if cause is None or round_ in self.restarts_noted or self.stopper.stopping:
            return
        if self.rounds.finished.get(round_, 0) < len(self.ranks):
            return
        self.restarts_noted.add(round_)
        self.sink.note(
            f"rank {cause.rank} on {cause.host} failed with {describe_exit(cause.exit_code)}; "
            f"torchrun restarts the workers (--max-restarts {self.max_restarts} per node)"
        )

    def node_exited(self, node: NodeState, code: int | None, when: float) -> str | None:
        if node.state == NodePhase.LOST:  # a node once lost stays lost in the record
            node.exit_code = code
            return None
        node.done, node.exit_code, node.ended_at = True, code, when
        stopping = self.stopper.stopping
        for rank in node.ranks:  # ranks still running had no chance to say how they ended
            if self.ranks[rank].state in (RankPhase.STARTING, RankPhase.RUNNING):
                self.ranks[rank].state = RankPhase.KILLED if stopping else RankPhase.UNKNOWN
        # After the warning, a node whose ranks all stopped on it (none failed) ends with
        # torchrun's nonzero code: stopped as asked, though no stop was sent.
        states = {self.ranks[r].state for r in node.ranks}
        on_warning = RankPhase.STOPPED in states and states <= {
            RankPhase.STOPPED,
            RankPhase.SUCCEEDED,
        }
        if code == 0:
            node.state = NodePhase.SUCCEEDED
        elif stopping or on_warning:
            node.state = NodePhase.STOPPED
        else:
            node.state = NodePhase.FAILED
            node.failed_first = True
            if self.stop_on_failure:
                self.sink.note(
                    f"{node.host}: node script ended with {describe_exit(code)}; "
                    "stopping the run on every node"
                )
                return f"{node.host} failed"
        return None

    def node_lost(self, node: NodeState, why: str, gone: bool = True) -> str | None:
        """`gone`: neither the agent nor the node's sshd answers (node or link down), as
        opposed to an agent silent on a node that still answers."""
        node.done, node.state, node.detail = True, NodePhase.LOST, why
        node.ended_at, node.lost_gone = time.time(), gone
        # A loss is a cause when it was seen before any stop, or when the node fell silent
        # before the stop began and is gone: then it may well be what failed the ranks.
        stopping = self.stopper.stopping
        wall = self.stopper.wall
        node.failed_first = not stopping or (gone and wall is not None and node.heard_wall < wall)
        for rank in node.ranks:
            if self.ranks[rank].exit_code is None:
                self.ranks[rank].state = RankPhase.UNKNOWN
        self.sink.node_note(node.host, f"lost: {why}")  # nodes lost alike: one line
        return None if stopping else f"{node.host} lost"

    def node_disk(self, node: NodeState, what: str, when: float) -> str | None:
        """The node's run directory cannot be written (`what`: "no space left on device in
        ~/..."), found by its agent after something failed there or the disk filled up."""
        if node.state == NodePhase.LOST or node.disk:
            return None
        node.disk, node.detail = what, what
        if self.stopper.stopping:  # found during the stop: not what stopped the run
            self.sink.note(f"{node.host}: {what}")
            return None
        node.disk_at = when
        if not self.stop_on_failure:
            return None
        self.sink.note(f"{node.host}: {what}; stopping the run on every node")
        return f"{node.host}: {what}"

    def hung(self, summary: str) -> str | None:
        """No rank moved for the hang timeout (supervise/hangs.py): the run ends `hung`. A
        stop either way: nothing else stops a hung run (under SLURM, srun ends a step on a
        failed task only)."""
        if self.stopper.stopping or self.hang_summary is not None:
            return None
        self.hang_summary = summary
        return "the run hangs: no rank moved"

    def unreachable(self, said: NoAnswer) -> str | None:
        """A node's processes got no answer from the store or a peer (agent/connects.py):
        the run ends `unreachable`, naming the pair; each pair is said once, whichever end
        says it. An address of no node of the run is only said; so is a report that comes
        after the run began to stop for another reason."""
        pair = said.pair
        if pair is None or (self.stopper.stopping and not self.unreachable_lines):
            self.sink.note(said.line())
            return None
        if pair in self.unreachable_pairs:
            return None
        self.unreachable_pairs.add(pair)
        self.unreachable_lines.append(said.line())
        if self.stopper.stopping:
            self.sink.note(said.line())
            return None
        self.sink.note(f"{said.line()}; stopping the run on every node")
        return f"{said.node.host} cannot reach {said.peer.host if said.peer else said.address}"

    # --- the end ------------------------------------------------------------------------

    def faults(self) -> list[Fault]:
        """Every failure that happened before the stop, earliest first: failed ranks at
        their exit, node scripts that failed, lost nodes at the last time heard, and disk
        faults. A node's disk fault explains every failure on that node: it stands in for
        them, at the earliest of their times."""
        found = [
            Fault(r.ended_at if r.ended_at is not None else float("inf"), "rank", r.exit_code, r)
            for r in self.ranks.values()
            if r.state == RankPhase.FAILED
        ]
        for node in self.nodes:
            if node.state == NodePhase.FAILED and node.failed_first:
                found.append(Fault(node.ended_at or float("inf"), "script", node.exit_code, node))
            elif node.state == NodePhase.LOST and node.failed_first:
                found.append(Fault(node.heard_wall, "lost", None, node))
        for node in self.nodes:
            if node.disk_at is None or node.state == NodePhase.LOST:
                continue
            here = [f.when for f in found if self.node_of(f) == node.index]
            found = [f for f in found if self.node_of(f) != node.index]
            found.append(Fault(min([node.disk_at, *here]), "disk", None, node))
        return sorted(found, key=lambda f: (f.when, FAULT_KINDS.index(f.kind)))

    @staticmethod
    def node_of(fault: Fault) -> int:
        subject = fault.subject
        return subject.node if isinstance(subject, RankState) else subject.index

    def settle_restarts(self) -> None:
        """At the end: a node script that failed means its torchrun gave up, and ranks that
        failed in the last round failed the run; earlier ones were stopped mid-restart."""
        if not self.max_restarts:
            return
        self.gave_up = any(node.state == NodePhase.FAILED for node in self.nodes)
        last = self.rounds.last()
        for rank in self.ranks.values():
            if rank.state == RankPhase.RESTARTING:
                final = self.gave_up and self.rounds.round_of(rank.rank) == last
                rank.state = RankPhase.FAILED if final else RankPhase.STOPPED

    def restart_lines(self) -> list[str]:
        causes = self.rounds.restarts(self.gave_up)
        return [
            describe_restart(n, cause, self.started_wall) for n, cause in enumerate(causes, start=1)
        ]

    def settle_teardown(self) -> None:
        """torchrun ends a node's other workers with SIGTERM once one of them fails, often
        before the stop reaches that node: a rank that ended so, no earlier than a rank of
        its node that failed by itself, was stopped, not failed."""
        for node in self.nodes:
            failed = [self.ranks[r] for r in node.ranks if self.ranks[r].state == RankPhase.FAILED]
            own = [r.ended_at for r in failed if not terminated(r.exit_code) and r.ended_at]
            for rank in failed if own else ():
                if terminated(rank.exit_code) and (rank.ended_at or 0) >= min(own):
                    rank.state = RankPhase.STOPPED

    def outcome(self, timed_out: bool = False) -> Outcome:
        self.settle_teardown()
        self.settle_restarts()
        outcome = self._outcome(timed_out)
        restarts = self.restart_lines()
        if restarts:
            head = f"restarted {len(restarts)} time(s) (--max-restarts {self.max_restarts}):"
            outcome.summary = "\n".join([outcome.summary, head] if outcome.summary else [head])
            outcome.summary += "".join(f"\n  {line}" for line in restarts)
        return outcome

    def facts(self, timed_out: bool) -> tuple[Facts, Fault | None]:
        faults, warning = self.faults(), self.warning
        first = faults[0] if faults else None
        # With --max-restarts, ranks that failed before torchrun gave up are settled at the
        # end; the node script that gave up carries the code of its last round's failure.
        world = all(r.state == RankPhase.SUCCEEDED for r in self.ranks.values()) and all(
            n.state == NodePhase.SUCCEEDED for n in self.nodes
        )
        facts = Facts(
            interrupted_by=self.stopper.interrupted_by,
            first_fault=first.kind if first else None,
            fault_code=first.code if first else None,
            timed_out=timed_out,
            any_lost=any(n.state == NodePhase.LOST for n in self.nodes),
            world_succeeded=world,
            hung=self.hang_summary is not None,
            unreachable=bool(self.unreachable_lines),
            warned=warning is not None and warning.sent_at is not None,
            all_exited_after_warning=warning is not None
            and warning.ended_on_it(self.ranks.values(), self.nodes, self.stopper.stopping),
        )
        return facts, first

    def _outcome(self, timed_out: bool) -> Outcome:
        facts, first = self.facts(timed_out)
        state, code, why = verdict(facts)
        warning = self.warning
        if facts.interrupted_by is not None:
            summary = f"stopped by {signal.Signals(facts.interrupted_by).name}"
        elif facts.unreachable:
            summary = "\n".join(
                ["job failed: a node cannot reach another:"]
                + [f"  {line}" for line in self.unreachable_lines]
            )
        elif facts.hung:
            summary = self.hang_summary or ""
        elif warning is not None and (why == ON_WARNING or facts.all_exited_after_warning):
            summary = warning.ended_summary(self.ranks, succeeded=state == RunState.SUCCEEDED)
        elif first is not None and first.kind == "rank":
            summary = self.rank_summary(first.subject)  # type: ignore[arg-type]
        elif first is not None:
            summary = self.node_summary(first.subject)  # type: ignore[arg-type]
        elif timed_out:
            summary = f"stopped: {self.stopper.reason}"
            summary += f"; {warning.limit_summary(self.ranks)}" if warning is not None else ""
        elif state == RunState.LOST:
            lost = min(
                (n for n in self.nodes if n.state == NodePhase.LOST), key=lambda n: n.heard_wall
            )
            summary = self.node_summary(lost)
        elif state == RunState.FAILED:
            summary = self.incomplete_summary()
        else:
            summary = ""
        return Outcome(state, code, summary, self.node_fault(facts, first))

    def node_fault(self, facts: Facts, first: Fault | None) -> NodeFault | None:
        """The node to blame when the first fault was the node's, not the job's: it was
        lost, its disk failed, or a process there was killed by SIGKILL or SIGBUS. A rank
        that exits non-zero by itself (an exception, exit 3) is the job's own error."""
        if facts.interrupted_by is not None or facts.hung or facts.unreachable or first is None:
            return None
        node = self.nodes[self.node_of(first)]
        if first.kind == "lost":
            why = f"lost: {node.detail}"
        elif first.kind == "disk":
            why = node.disk
        elif killed_from_outside(first.code):
            subject = first.subject
            what = f"rank {subject.rank}" if isinstance(subject, RankState) else "torchrun"
            why = f"{what} killed by {describe_exit(first.code)}"
        else:
            return None
        noticed = self.stopper.wall if self.stopper.wall is not None else time.time()
        return NodeFault(node.index, node.host, why, noticed)

    def incomplete_summary(self) -> str:
        """Why a run in which nothing failed did not succeed: what did not end with 0."""
        ranks = sorted(
            (r for r in self.ranks.values() if r.state != RankPhase.SUCCEEDED), key=lambda r: r.rank
        )
        nodes = [n for n in self.nodes if n.state != NodePhase.SUCCEEDED]
        if ranks:
            rank = ranks[0]
            head = (
                f"job failed: {len(ranks)} rank(s) did not end with exit code 0; rank "
                f"{rank.rank} on {rank.host}: {rank.state}, {describe_exit(rank.exit_code)}"
            )
        else:
            node = nodes[0]
            head = f"job failed: the node script on {node.host}: {node.state}, " + describe_exit(
                node.exit_code
            )
        reason = f" (the run was stopped: {self.stopper.reason})" if self.stopper.reason else ""
        return head + reason

    def rank_summary(self, rank: RankState) -> str:
        elapsed = max(0.0, (rank.ended_at or time.time()) - self.started_wall)
        lines = [
            f"job failed: rank {rank.rank} (local rank {rank.local_rank}) on {rank.host} "
            f"ended with {describe_exit(rank.exit_code)} after {elapsed:.1f} s "
            "(the first rank to fail)"
        ]
        tail = self.sink.last_lines(rank=rank.rank)
        lines.append(
            f"last {len(tail)} line(s) of rank {rank.rank}:"
            if tail
            else f"rank {rank.rank} printed nothing"
        )
        lines += [f"  {line}" for line in tail]
        if rank.error_file:
            lines.append(f"torch error file of rank {rank.rank}:")
            lines += [f"  {line}" for line in rank.error_file.strip().splitlines()[-20:]]
        return "\n".join(lines)

    def node_summary(self, node: NodeState) -> str:
        if node.disk and node.state != NodePhase.LOST:
            head = f"job failed: {node.host}: {node.disk}"
        elif node.state == NodePhase.LOST:
            head = f"job failed: node {node.host} was lost: {node.detail}"
        else:
            head = (
                f"job failed: the node script on {node.host} ended with "
                f"{describe_exit(node.exit_code)} before any rank failed"
            )
        tail = self.sink.last_lines(node=node.index)
        lines = [head] + ([f"last {len(tail)} line(s) from {node.host}:"] if tail else [])
        return "\n".join(lines + [f"  {line}" for line in tail])
