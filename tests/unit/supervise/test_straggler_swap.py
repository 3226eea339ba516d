"""A slow node taken out at a checkpoint, without a cluster: which ranks are slow on both
signals, the streak a node must keep for the whole bound (a burst never counts), the
policy that never goes below the floor, the supervisor asking the ranks for a checkpoint,
and the pool taking the node out as a fault without asking it back. End to end (a CPU
quota on a node's ranks, a spare in at the checkpoint, the same final weights):
tests/cluster/test_straggler_swap_cluster.py."""

from __future__ import annotations

import time
from dataclasses import replace

from orchestrator.attempts.next_attempt import Next
from orchestrator.record.states import RankPhase
from orchestrator.start.regrow import Regrow
from orchestrator.supervise.state import NodeFault
from orchestrator.supervise.straggler_swap import StragglerSwap
from orchestrator.supervise.stragglers import Stragglers
from tests.factories import SUPERVISION, FakeSession, Notes, supervisor, world
from tests.unit.start.test_recovery import Connection, Probe
from tests.unit.start.test_shrink import pool

WINDOW = 10.0


def fed(stragglers: Stragglers, until: float, work: dict[int, float], step: float | None):
    """Every rank's record once a second up to `until`: its own work, the common step."""
    for t in range(int(until) + 1):
        for rank, w in work.items():
            record = {"work_s": w, "steps": 4, **({"step_s": step} if step is not None else {})}
            stragglers.observe(rank, record, float(t))


def test_a_rank_is_slow_only_on_both_signals() -> None:
    hosts = {r: f"n{r}" for r in range(4)}
    slowed = Stragglers(hosts, ratio=1.5, window_s=WINDOW)
    fed(slowed, 20, {0: 0.1, 1: 0.1, 2: 0.4, 3: 0.1}, step=0.42)
    assert slowed.slow(20.0, {0, 1, 2, 3}) == {2: (4.0, 4.2)}
    assert slowed.slow(20.0, {0, 1, 3}) == {}  # not running: never slow
    # Its work alone, with no step reported: one signal, never slow.
    unstepped = Stragglers(hosts, ratio=1.5, window_s=WINDOW)
    fed(unstepped, 20, {0: 0.1, 1: 0.1, 2: 0.4, 3: 0.1}, step=None)
    assert unstepped.slow(20.0, {0, 1, 2, 3}) == {}
    # A step no longer than the others' work (the run does not wait for it): not slow.
    overlapped = Stragglers(hosts, ratio=1.5, window_s=WINDOW)
    fed(overlapped, 20, {0: 0.1, 1: 0.1, 2: 0.4, 3: 0.1}, step=0.12)
    assert overlapped.slow(20.0, {0, 1, 2, 3}) == {}
    # Everyone slower together: nobody to take out.
    together = Stragglers(hosts, ratio=1.5, window_s=WINDOW)
    fed(together, 20, {r: 0.4 for r in range(4)}, step=0.9)
    assert together.slow(20.0, {0, 1, 2, 3}) == {}


def swap(policy: Next = Next.SPARE, after: float = 30.0) -> tuple[StragglerSwap, Notes]:
    notes = Notes()
    return StragglerSwap(after, lambda: policy, notes.note), notes


def test_a_node_slow_for_the_whole_bound_is_due_once_and_said_before() -> None:
    nodes, _ = world(("n0", "n1", "n2"), nproc=2)
    watch, notes = swap(after=30.0)
    slow = {3: (2.5, 2.4)}  # a rank of n1
    due = [watch.check(float(t), lambda: slow, nodes) for t in range(0, 31)]
    assert due[:30] == [None] * 30
    fault = due[30]
    assert fault is not None and (fault.index, fault.host, fault.slow) == (1, "n1", True)
    assert fault.why == "slow: rank 3's step work 2.5x the median for 30 s"
    (line,) = notes.notes
    assert line == (
        "straggler swap: n1 (node 1) slow for 30 s: rank 3's step work 2.5x the other ranks' "
        "median, the run's step 2.4x it; taking it out at a checkpoint now: a spare takes its "
        "place"
    )
    assert watch.check(31.0, lambda: slow, nodes) is None  # due already: never twice
    assert watch.due is fault


def test_a_burst_shorter_than_the_bound_never_counts() -> None:
    nodes, _ = world(("n0", "n1", "n2"), nproc=1)
    watch, notes = swap(after=30.0)
    for t in range(0, 60):
        slow = {1: (3.0, 3.0)} if t % 40 < 20 else {}  # slow 20 s, fast 20 s, slow again
        assert watch.check(float(t), lambda slow=slow: slow, nodes) is None
    assert notes.notes == []
    # Checked at most once a second: a pass in between asks nothing.
    asked = []
    watch.check(59.5, lambda: asked.append(1) or {}, nodes)
    assert asked == []


def test_never_below_the_floor_said_once_and_the_node_stays() -> None:
    nodes, _ = world(("n0", "n1", "n2"), nproc=1)
    watch, notes = swap(policy=Next.FLOOR, after=5.0)
    for t in range(0, 20):
        assert watch.check(float(t), lambda: {2: (3.0, 3.0)}, nodes) is None
    assert notes.notes == [
        "straggler swap: n2 (node 2) slow for 5 s: rank 2's step work 3.0x the other ranks' "
        "median, the run's step 3.0x it; it stays: no spare left, and without it fewer than "
        "--min-nodes would be left"
    ]
    shrinking, notes = swap(policy=Next.SHRINK, after=5.0)
    for t in range(0, 6):
        shrinking.check(float(t), lambda: {2: (3.0, 3.0)}, nodes)
    assert shrinking.due is not None and "the nodes left" in notes.notes[-1]


def test_the_supervisor_asks_the_ranks_for_a_checkpoint_for_a_slow_node(tmp_path) -> None:
    watched = replace(SUPERVISION, stragglers=(1.5, WINDOW), swap_stragglers_after=15.0)
    sessions = [FakeSession(i) for i in range(3)]
    sup = supervisor(
        None, ("n0", "n1", "n2"), 1, sessions=sessions, supervision=watched,
        lose_one=lambda: Next.SPARE, metrics_path=tmp_path / "metrics.jsonl",
    )  # fmt: skip
    for rank in sup.ranks.values():
        rank.state = RankPhase.RUNNING
    start = time.time()
    for t in range(0, 40):
        now = start + t
        for rank in range(3):
            work = 0.5 if rank == 1 else 0.1
            sup.metrics.stragglers.observe(rank, {"work_s": work, "step_s": 0.52}, now)
        sup.swap_if_slow(now)
        if sup.swap_due is not None:
            break
    fault = sup.swap_due
    assert fault is not None and fault.host == "n1" and fault.slow
    # Slow from the window's half-cover (5 s) on, due 15 s later.
    assert 19 <= now - start <= 22, now - start
    assert sup.checkpoint_asked == "taking out slow n1"
    sup.metrics.close()
    events = (tmp_path / "metrics.jsonl").read_text()
    assert '"event":"swap"' in events and fault.why in events
    # Off with --no-swap-stragglers, or without a policy (no --spares, no --min-nodes).
    off = replace(SUPERVISION, swap_stragglers=False)
    assert supervisor(None, lose_one=lambda: Next.SPARE, supervision=off).swap is None
    assert supervisor(None).swap is None


def test_the_pool_takes_a_slow_node_out_as_a_fault_and_never_asks_it_back() -> None:
    spared, _ = pool(hosts=3, spares=1, min_nodes=None)
    assert spared.may_swap and spared.lose_one() is Next.SPARE
    bare, _ = pool(hosts=3, spares=0, min_nodes=None)
    assert not bare.may_swap
    floor, _ = pool(hosts=2, spares=0, min_nodes=2)
    assert floor.may_swap and floor.lose_one() is Next.FLOOR
    shrinking, notes = pool(hosts=3, spares=0, min_nodes=2)
    assert shrinking.lose_one() is Next.SHRINK
    slow = NodeFault(1, "n1", "slow: rank 1's step work 3.0x the median for 30 s", 0.0, True)
    shrinking.recover(slow, Probe())
    assert [m.host.name for m in shrinking.active] == ["n0", "n2"]
    assert [m.host.name for m in shrinking.gone] == ["n1"] and shrinking.slow == {"n1"}
    asking = Regrow(shrinking, 10.0, Probe(), lambda h: Connection(h.name))
    assert asking.asked() == []  # still slow if it answers: not asked back in this run
