"""The end of a supervised run, read from what the intake (detect.py) kept of every node and
rank: the faults in the order they happened, the facts the verdict is made of, the outcome,
and its words (who failed first, the last lines, why a run did not succeed).
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass

from orchestrator.record.states import NodePhase, RankPhase, RunState
from orchestrator.supervise.restarts import describe_restart
from orchestrator.supervise.state import (
    NodeFault,
    NodeState,
    Outcome,
    RankState,
    describe_exit,
    killed_from_outside,
    terminated,
)
from orchestrator.supervise.verdict import FAULT_KINDS, ON_WARNING, Facts, verdict


@dataclass(frozen=True)
class Fault:
    """A failure that happened before the run was stopped (see Detector.faults)."""

    when: float  # the controller's clock
    kind: str  # one of verdict.FAULT_KINDS
    code: int | None
    subject: RankState | NodeState


class Summaries:
    """The part of the Detector that reads the run's end from the states its intake kept."""

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
