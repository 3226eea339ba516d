"""A persistent straggler taken out at a checkpoint (--spares, --min-nodes; both backends).

Once a second the supervisor asks the stragglers (stragglers.py `slow`) which running ranks
are slow now on both signals: their own step work above RATIO times the other ranks'
median, and the step above RATIO times that median too (the run waits for them). A node
with such a rank begins a streak; a pass where none of its ranks is slow ends it, so a
burst shorter than the bound (--swap-stragglers-after) never counts. When a streak lasts the
bound, the backend's policy says what losing the node would lead to (attempts/
next_attempt.py, from the pool's facts): while that goes on (a spare in, or the nodes left
at or above --min-nodes), the console says what was seen, the ranks are asked for a
checkpoint (the warning signal) and the node is `due`: the attempt that ends at the
checkpoint ends as this node's fault, which the backend carries out as it does a lost
node's (the bad-node list, with why). When it would not go on (no spare left, the floor),
that is said once and the node stays.

Every attempt has a supervisor of its own: a node that stays, or one swapped in, must be
slow for the whole bound again before it is taken out, never on what an earlier attempt saw.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from orchestrator.attempts.next_attempt import Next
from orchestrator.supervise.state import NodeFault, NodeState

CHECK_S = 1.0  # how often the streaks are looked at

GOING_ON = {
    Next.SPARE: "a spare takes its place",
    Next.SHRINK: "the run goes on with the nodes left, at the same global batch (--min-nodes)",
}
STAYING = {
    Next.FLOOR: "it stays: no spare left, and without it fewer than --min-nodes would be left",
    Next.UNREPLACED: "it stays: no spare left (--spares) and no --min-nodes to go on without it",
}


class StragglerSwap:
    """The slow streak of each node of one attempt, and the node due to be taken out."""

    def __init__(
        self, after_s: float, policy: Callable[[], Next], note: Callable[[str], None]
    ) -> None:
        self.after_s = after_s
        self.policy = policy  # what a node lost now would lead to
        self.note = note
        self.since: dict[int, float] = {}  # node index -> when its streak began
        self.due: NodeFault | None = None
        self.held: set[int] = set()  # nodes said to stay
        self.checked = float("-inf")

    def check(
        self,
        now: float,
        slow_now: Callable[[], dict[int, tuple[float, float]]],
        nodes: Sequence[NodeState],
    ) -> NodeFault | None:
        """The node due now (the caller asks the ranks for a checkpoint), else None.
        `slow_now`: rank -> (its work over the others' median, the step over it), as
        stragglers.py finds them now (asked at most once a CHECK_S)."""
        if self.due is not None or now - self.checked < CHECK_S:
            return None
        self.checked = now
        slow = slow_now()
        slowest = {}  # node index -> its slowest rank that is slow now
        for node in nodes:
            ranks = [rank for rank in node.ranks if rank in slow]
            if ranks:
                slowest[node.index] = max(ranks, key=lambda rank: slow[rank][0])
        self.since = {index: self.since.get(index, now) for index in slowest}
        for node in nodes:
            began = self.since.get(node.index)
            if began is None or now - began < self.after_s:
                continue
            rank = slowest[node.index]
            work, step = slow[rank]
            saw = (
                f"{node.host} (node {node.index}) slow for {now - began:.0f} s: rank {rank}'s "
                f"step work {work:.1f}x the other ranks' median, the run's step {step:.1f}x it"
            )
            then = self.policy()
            if then not in GOING_ON:
                if node.index not in self.held:
                    self.held.add(node.index)
                    self.note(f"straggler swap: {saw}; {STAYING.get(then, 'it stays')}")
                continue
            self.note(f"straggler swap: {saw}; taking it out at a checkpoint now: {GOING_ON[then]}")
            why = f"slow: rank {rank}'s step work {work:.1f}x the median for {now - began:.0f} s"
            self.due = NodeFault(node.index, node.host, why, now, slow=True)
            return self.due
        return None
