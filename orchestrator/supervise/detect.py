"""Failure detection: from rank and node exits and silence, each node's and rank's state,
which of them failed first, whether a node was lost, and how the run ended, in words.

Deciding *that* the run must stop is here; stopping it is `stopping.Stopper`'s part.
The methods that see a failure return why the run must stop (or None). Here is the intake,
the reports as they come; what the run's end reads of them (its faults, verdict and words)
is summaries.py's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from orchestrator.record.states import NodePhase, RankPhase
from orchestrator.supervise.restarts import Rounds
from orchestrator.supervise.state import NodeState, RankState, describe_exit
from orchestrator.supervise.stopping import Stopper
from orchestrator.supervise.summaries import Summaries
from orchestrator.supervise.time_limit import WarningClock
from orchestrator.supervise.unreachable import NoAnswer


class Sink(Protocol):
    def note(self, text: str) -> None: ...

    def last_lines(self, rank: int | None = None, node: int | None = None) -> list[str]: ...


class Detector(Summaries):
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
        if self.nodes[state.node].state == NodePhase.LOST:  # what it says later is not heard
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
