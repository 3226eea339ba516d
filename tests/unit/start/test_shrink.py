"""--min-nodes in the node pool, without a cluster: a node fault with no spare left leaves
the node out (the others renumbered in order, the master moved with node 0, node 0 or
everyone probed again), down to the floor and no further; hosts that fail the preflight or
cannot be reached are left out at the start; the run record's world world. The probe is
a stand-in (the boundary being the nodes); end to end: tests/cluster/test_shrink_cluster.py."""

from __future__ import annotations

import time

import pytest

from orchestrator.attempts.next_attempt import Next
from orchestrator.errors import NodeError, NodeErrors
from orchestrator.hosts.hostfile import parse_hostfile
from orchestrator.hosts.selection import hold_spares
from orchestrator.plan.launch_plan import LAUNCH_WORLD_SIZE, make_plan
from orchestrator.record.world import AttemptWorld, describe_world, seconds_on_fewer_nodes
from orchestrator.start.joining import grow, room, take
from orchestrator.start.pool import Member, NodePool
from orchestrator.supervise.state import NodeFault, Outcome
from tests.unit.plan.test_plan import spec
from tests.unit.start.test_recovery import Connection, Probe


def pool(
    hosts: int = 4, spares: int = 0, min_nodes: int | None = 2, slots: int = 1
) -> tuple[NodePool, list[str]]:
    names = [f"n{i} slots={slots}" for i in range(hosts)] + [f"s{i}" for i in range(spares)]
    cluster = hold_spares(parse_hostfile("\n".join(names) + "\n", "h.txt"), spares)
    connections = [Connection(h.name) for h in (*cluster.hosts, *cluster.spares)]
    notes: list[str] = []
    made = NodePool(cluster, connections, "r1", None, notes.append, min_nodes)
    made.begin(make_plan(made.cluster, spec(), "r1", made.facts))
    return made, notes


def lost(index: int, host: str) -> Outcome:
    fault = NodeFault(index, host, "lost: no word from its agent for 5 s", time.time())
    return Outcome("lost", 1, f"job failed: node {host} was lost", fault)


def replan(p: NodePool):
    plan = make_plan(p.cluster, spec(), "r1", p.facts, p.attempt, p.launched_with)
    p.begin(plan)
    return plan


def test_a_lost_worker_leaves_the_others_renumbered_in_order() -> None:
    p, notes = pool()
    outcome = lost(2, "n2")
    assert p.will_replace(outcome)
    probe = Probe()
    assert p.recover(outcome.node_fault, probe) is None  # no spare took its place
    assert [h.name for h in p.cluster.hosts] == ["n0", "n1", "n3"]
    assert p.connections[2].host == "n3"  # n3 is node rank 2 now, its connection with it
    assert probe.calls == [["n0"]]  # the master for a fresh port
    assert p.attempt == 2
    assert "n2 lost; no spare left; going on with 3 of 4 nodes (--min-nodes 2)" in notes
    plan = replan(p)
    assert [(n.node_rank, n.name, n.ranks) for n in plan.nodes] == [
        (0, "n0", range(0, 1)),
        (1, "n1", range(1, 2)),
        (2, "n3", range(2, 3)),
    ]
    assert plan.world_size == 3 and plan.nnodes == 3
    assert {dict(n.env)[LAUNCH_WORLD_SIZE] for n in plan.nodes} == {"4"}


def test_a_lost_master_moves_the_master_and_probes_everyone_again() -> None:
    p, notes = pool(slots=2)
    probe = Probe()
    p.recover(lost(0, "n0").node_fault, probe)
    assert probe.calls == [["n1", "n2", "n3"]]  # every route leads to the new master
    plan = replan(p)
    assert plan.nodes[0].name == "n1" and plan.master_addr == "n1"
    assert plan.world_size == 6
    assert {dict(n.env)[LAUNCH_WORLD_SIZE] for n in plan.nodes} == {"8"}
    assert "n0 lost; no spare left; going on with 3 of 4 nodes (--min-nodes 2)" in notes


def test_the_floor_ends_the_run_naming_the_node() -> None:
    p, _ = pool(hosts=3, min_nodes=2)
    p.recover(lost(1, "n1").node_fault, Probe())
    replan(p)
    outcome = lost(1, "n2")
    assert p.after(outcome.node_fault) is Next.FLOOR and not p.will_replace(outcome)
    assert p.recover(outcome.node_fault, Probe()) is None
    assert [h.name for h in p.cluster.hosts] == ["n0", "n2"]  # as it was: the run ends
    ended = p.amend(outcome)
    assert "n2 lost; no spare left; 1 of 3 nodes left, below --min-nodes 2" in ended.summary
    assert ended.summary.splitlines()[-1].startswith("on fewer nodes than the 3 launched with")


def test_without_min_nodes_a_lost_node_ends_the_run_as_before() -> None:
    p, _ = pool(min_nodes=None)
    outcome = lost(1, "n1")
    assert p.after(outcome.node_fault) is Next.UNREPLACED and not p.will_replace(outcome)
    ended = p.amend(outcome)
    assert "no spare node to replace it" in ended.summary and "fewer" not in ended.summary


def test_a_job_error_never_shrinks() -> None:
    p, _ = pool()
    assert not p.will_replace(Outcome("failed", 3, "rank 1 failed", None))
    assert p.recover(None, Probe()) is None and len(p.cluster.hosts) == 4


def test_spares_are_used_first_then_the_run_shrinks() -> None:
    p, notes = pool(hosts=3, spares=1)
    p.recover(lost(1, "n1").node_fault, Probe())
    assert [h.name for h in p.cluster.hosts] == ["n0", "s0", "n2"]
    replan(p)
    p.recover(lost(2, "n2").node_fault, Probe())
    assert [h.name for h in p.cluster.hosts] == ["n0", "s0"]
    replan(p)
    assert "n2 lost; no spare left; going on with 2 of 3 nodes (--min-nodes 2)" in notes
    world = p.status()["world"]
    assert [len(w["nodes"]) for w in world] == [3, 3, 2]
    assert [w["attempt"] for w in world] == [1, 2, 3]
    assert world[0]["why"] == "launch"
    assert world[1]["why"].startswith("n1 (lost: no word from its agent for 5 s) replaced by s0")
    assert world[2]["why"] == (
        "n2 (lost: no word from its agent for 5 s) left out, no spare left: 2 of 3 nodes"
    )


def test_a_survivor_that_fails_its_probe_after_a_shrink_ends_the_run() -> None:
    p, _ = pool()
    with pytest.raises(NodeErrors, match="n0: preflight probe failed"):
        p.recover(lost(2, "n2").node_fault, Probe("n0"))


def test_the_preflight_leaves_out_failing_hosts_down_to_the_floor() -> None:
    p, notes = pool(hosts=4, min_nodes=2)
    probe = Probe("n0", "n2")
    p.preflight(probe)
    assert [h.name for h in p.cluster.hosts] == ["n1", "n3"]
    assert probe.calls[-1] == ["n1", "n3"]  # the master moved: probed again
    (line,) = [n for n in notes if n.startswith("leaving out")]
    assert line == (
        "leaving out 2 host(s) that failed the preflight: n0 (preflight: preflight probe "
        "failed (exit code 1)); n2 (preflight: preflight probe failed (exit code 1)); going "
        "on with 2 node(s) (--min-nodes 2)"
    )
    p, _ = pool(hosts=4, min_nodes=3)
    with pytest.raises(NodeErrors, match="preflight failed on 2 node"):
        p.preflight(Probe("n0", "n2"))


def test_the_preflight_takes_a_spare_before_leaving_a_host_out() -> None:
    names = ["n0", "n1", "n2", "s0"]
    cluster = hold_spares(parse_hostfile("\n".join(names) + "\n", "h.txt"), 1)
    notes: list[str] = []
    p = NodePool(cluster, [Connection(n) for n in names], "r1", None, notes.append, 1)
    p.preflight(Probe("n1", "n2"))
    assert [h.name for h in p.cluster.hosts] == ["n0", "s0"]
    p.begin(make_plan(p.cluster, spec(), "r1", p.facts))
    assert [w["why"] for w in p.status()["world"]] == ["launch"]
    assert p.launched_with == (1, 1)
    assert any("spare s0 takes node rank 1" in n for n in notes)
    assert any(n.startswith("leaving out 1 host(s) that failed the preflight: n2") for n in notes)


def test_hosts_that_cannot_be_reached_are_left_out_at_the_start() -> None:
    cluster = parse_hostfile("n0\nn1\nn2\n", "h.txt")
    connections = [Connection("n0"), None, Connection("n2")]
    notes: list[str] = []
    p = NodePool(cluster, connections, "r1", None, notes.append, 2)
    p.replace_unreachable({1: NodeError("n1", "no answer within 5 s")})
    assert [h.name for h in p.cluster.hosts] == ["n0", "n2"]
    assert notes[-1] == (
        "leaving out 1 host(s) that cannot be reached: n1 (no answer within 5 s); going on "
        "with 2 node(s) (--min-nodes 2)"
    )
    p = NodePool(cluster, connections, "r1", None, notes.append, 3)
    with pytest.raises(NodeErrors, match="n1: no answer"):
        p.replace_unreachable({1: NodeError("n1", "no answer within 5 s")})


def test_after_a_host_left_out_at_the_start_every_line_counts_the_hosts_chosen() -> None:
    """One N in `K of N nodes`, whether a node is lost, joins, or the floor is reached: the
    hosts the launch chose, the one left out at the start included (it may join later)."""
    cluster = parse_hostfile("n0\nn1\nn2\nn3\n", "h.txt")
    connections = [Connection("n0"), Connection("n1"), None, Connection("n3")]
    notes: list[str] = []
    p = NodePool(cluster, connections, "r1", None, notes.append, 2)
    p.replace_unreachable({2: NodeError("n2", "no answer within 5 s")})
    p.begin(make_plan(p.cluster, spec(), "r1", p.facts))
    assert p.recover(lost(2, "n3").node_fault, Probe()) is None
    assert "n3 lost; no spare left; going on with 2 of 4 nodes (--min-nodes 2)" in notes
    assert p.change.endswith(": 2 of 4 nodes"), p.change
    assert p.used_up(lost(1, "n1").node_fault) == (
        "n1 lost; no spare left; 1 of 4 nodes left, below --min-nodes 2: the floor was reached"
    )
    take(p, Member(cluster.hosts[2], Connection("n2")), joins=True)
    grow(p, None)
    assert p.change == "n2 back: 3 of 4 nodes", p.change


def test_time_on_fewer_nodes_counts_the_smaller_world_entries_only() -> None:
    world = [
        AttemptWorld(1, ("a", "b", "c"), 3, 100.0, "launch"),
        AttemptWorld(2, ("a", "c"), 2, 130.0, "b lost"),
        AttemptWorld(3, ("a", "b", "c"), 3, 150.0, "b back"),
        AttemptWorld(4, ("a",), 1, 170.0, "b, c lost"),
    ]
    assert seconds_on_fewer_nodes(world, until=175.0) == pytest.approx(25.0)
    shown = describe_world(world[1].to_dict())
    assert shown.startswith("attempt 2: 2 node(s), 2 rank(s) since ") and shown.endswith(
        "(b lost): a, c"
    )


def test_a_node_that_answers_again_joins_after_the_others_up_to_the_launch() -> None:
    p, _ = pool()
    p.recover(lost(0, "n0").node_fault, Probe())
    replan(p)
    assert [m.host.name for m in p.gone] == ["n0"]
    assert room(p) == 1
    take(p, Member(p.gone[0].host, Connection("n0")), joins=True)
    assert room(p) == 0 and p.gone == []
    probe = Probe()
    grow(p, probe)
    assert [h.name for h in p.cluster.hosts] == ["n1", "n2", "n3", "n0"]  # the master stays
    assert probe.calls == [["n1", "n0"]]  # the master, and the node that came back
    assert p.attempt == 3 and p.gone == [] and p.back == []
    plan = replan(p)
    assert plan.world_size == 4 and plan.master_addr == "n1"
    assert [len(w["nodes"]) for w in p.status()["world"]] == [4, 3, 4]
    assert p.status()["world"][2]["why"] == "n0 back: 4 of 4 nodes"
    grow(p, Probe())  # nothing came back: nothing changes
    assert p.attempt == 3
