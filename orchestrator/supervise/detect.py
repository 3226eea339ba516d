"""Failure detection: from rank and node exits and silence, each node's and rank's state,
which of them failed first, whether a node was lost, and how the run ended, in words.

Deciding *that* the run must stop is here; stopping it is `stopping.Stopper`'s part.
The methods that see a failure return why the run must stop (or None).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from typing import Protocol

from orchestrator.supervise.restarts import Rounds, describe_restart
from orchestrator.supervise.state import NodeState, Outcome, RankState, describe_exit
from orchestrator.supervise.stopping import Stopper


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
        self.gave_up = False

    # --- reports ------------------------------------------------------------------------

    def rank_exited(self, rank: int, code: int, when: float) -> str | None:
        state = self.ranks[rank]
        state.exit_code, state.ended_at = code, when
        failed = code != 0 and not self.stopper.caused(when)
        if self.max_restarts:
            _, first = self.rounds.ended(state, code, when, failed)
            if failed:
                state.state = "restarting"
                if first and not self.stopper.stopping:
                    self.sink.note(
                        f"rank {rank} on {state.host} failed with "
                        f"{describe_exit(code)}; torchrun restarts the workers "
                        f"(--max-restarts {self.max_restarts} per node)"
                    )
                return None
        if code == 0:
            state.state = "succeeded"
        elif self.stopper.caused(when):
            state.state = "stopped"
        else:
            state.state = "failed"
            if self.stop_on_failure and not self.stopper.stopping:
                self.sink.note(
                    f"rank {rank} on {state.host} failed with "
                    f"{describe_exit(code)}; stopping the run on every node"
                )
                return f"rank {rank} on {state.host} failed"
        return None

    def node_exited(self, node: NodeState, code: int | None, when: float) -> str | None:
        node.done, node.exit_code, node.ended_at = True, code, when
        stopping = self.stopper.stopping
        for rank in node.ranks:  # ranks still running had no chance to say how they ended
            if self.ranks[rank].state in ("starting", "running"):
                self.ranks[rank].state = "killed" if stopping else "unknown"
        if code == 0:
            node.state = "succeeded"
        elif stopping:
            node.state = "stopped"
        else:
            node.state = "failed"
            if self.stop_on_failure:
                self.sink.note(
                    f"{node.host}: node script ended with {describe_exit(code)}; "
                    "stopping the run on every node"
                )
                return f"{node.host} failed"
        return None

    def node_lost(self, node: NodeState, why: str) -> str | None:
        node.done, node.state, node.detail = True, "lost", why
        node.ended_at = time.time()
        for rank in node.ranks:
            if self.ranks[rank].exit_code is None:
                self.ranks[rank].state = "unknown"
        self.sink.note(f"{node.host}: lost: {why}")
        return None if self.stopper.stopping else f"{node.host} lost"

    def silent_nodes(self, now: float, heartbeat_timeout: float) -> list[tuple[NodeState, str]]:
        """Nodes to count as lost: silent too long, or not reporting back after a stop."""
        lost = []
        for node in self.nodes:
            if node.done:
                continue
            silent = now - node.last_heard
            if heartbeat_timeout > 0 and silent > heartbeat_timeout:
                lost.append(
                    (
                        node,
                        f"no word from its agent for {silent:.0f} s "
                        "(link down, node or sshd gone?)",
                    )
                )
            elif self.stopper.overdue(now):
                lost.append((node, "its agent did not report back after the stop"))
        return lost

    # --- the end ------------------------------------------------------------------------

    def first_failed_rank(self) -> RankState | None:
        failed = [r for r in self.ranks.values() if r.state == "failed"]
        return min(failed, key=lambda r: (r.ended_at or float("inf"), r.rank), default=None)

    def settle_restarts(self) -> None:
        """At the end: a node script that failed means its torchrun gave up, and ranks that
        failed in the last round failed the run; earlier ones were stopped mid-restart."""
        if not self.max_restarts:
            return
        self.gave_up = any(node.state == "failed" for node in self.nodes)
        last = self.rounds.last()
        for rank in self.ranks.values():
            if rank.state == "restarting":
                final = self.gave_up and self.rounds.round_of(rank.rank) == last
                rank.state = "failed" if final else "stopped"

    def restart_lines(self) -> list[str]:
        causes = self.rounds.restarts(self.gave_up)
        return [
            describe_restart(n, cause, self.started_wall) for n, cause in enumerate(causes, start=1)
        ]

    def outcome(self, timed_out: bool = False) -> Outcome:
        self.settle_restarts()
        outcome = self._outcome(timed_out)
        restarts = self.restart_lines()
        if restarts:
            head = f"restarted {len(restarts)} time(s) (--max-restarts {self.max_restarts}):"
            outcome.summary = "\n".join([outcome.summary, head] if outcome.summary else [head])
            outcome.summary += "".join(f"\n  {line}" for line in restarts)
        return outcome

    def _outcome(self, timed_out: bool) -> Outcome:
        interrupted_by = self.stopper.interrupted_by
        if interrupted_by is not None:
            return Outcome(
                "stopped", 128 + interrupted_by, f"stopped by {signal.Signals(interrupted_by).name}"
            )
        rank = self.first_failed_rank()
        if rank is not None:
            return Outcome("failed", rank.exit_code or 1, self.rank_summary(rank))
        if timed_out:
            return Outcome("failed", 124, f"stopped: {self.stopper.reason}")
        failed = [n for n in self.nodes if n.state in ("failed", "lost")]
        if failed:
            first = min(failed, key=lambda n: n.ended_at or float("inf"))
            state = "lost" if first.state == "lost" else "failed"
            code = first.exit_code if first.state == "failed" and first.exit_code else 1
            return Outcome(state, code, self.node_summary(first))
        return Outcome("succeeded", 0)

    def rank_summary(self, rank: RankState) -> str:
        elapsed = (rank.ended_at or time.time()) - self.started_wall
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
        if node.state == "lost":
            head = f"job failed: node {node.host} was lost: {node.detail}"
        else:
            head = (
                f"job failed: the node script on {node.host} ended with "
                f"{describe_exit(node.exit_code)} before any rank failed"
            )
        tail = self.sink.last_lines(node=node.index)
        lines = [head] + ([f"last {len(tail)} line(s) from {node.host}:"] if tail else [])
        return "\n".join(lines + [f"  {line}" for line in tail])
