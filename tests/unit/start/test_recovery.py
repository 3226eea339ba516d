"""Node recovery's parts without a cluster: which faults are the node's (a spare replaces
it) and which are the job's (no spare used), the spares held back, the pool that swaps a
spare in and probes it, and the bad-node list. The probe is a stand-in here, the boundary
being the nodes; the end-to-end behaviour is in test_recovery_cluster.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError, NodeError, NodeErrors, SourceError
from orchestrator.hosts.hostfile import parse_hostfile
from orchestrator.hosts.selection import hold_spares
from orchestrator.nodes.probe import ProbeResult
from orchestrator.plan.launch_plan import NodeFacts, make_plan, node_dir
from orchestrator.plan.scripts import plan_yaml
from orchestrator.record.bad_nodes import add_bad_node, read_bad_nodes, skip_bad_nodes
from orchestrator.start.pool import NodePool
from orchestrator.supervise.state import NodeFault, Outcome
from tests.unit.plan.test_plan import spec
from tests.unit.supervise.test_supervise import detector

# --- whose fault -----------------------------------------------------------------------


def test_a_lost_node_is_a_node_fault() -> None:
    det, _, _ = detector()
    det.node_lost(det.nodes[1], "no word from its agent for 30 s")
    fault = det.outcome().node_fault
    assert fault is not None and (fault.index, fault.host) == (1, "b")
    assert fault.why == "lost: no word from its agent for 30 s"


@pytest.mark.parametrize("code", [137, -9, 135, -7])
def test_a_rank_killed_by_sigkill_or_sigbus_is_a_node_fault(code: int) -> None:
    det, _, _ = detector()
    det.rank_exited(2, code, time.time())
    fault = det.outcome().node_fault
    assert fault is not None and fault.index == 1 and fault.why.startswith("rank 2 killed by")


@pytest.mark.parametrize("code", [1, 3, 143, -15, 134])
def test_a_rank_that_fails_by_itself_is_the_jobs_error(code: int) -> None:
    det, _, _ = detector()
    det.rank_exited(2, code, time.time())
    assert det.outcome().node_fault is None


def test_a_full_disk_is_a_node_fault() -> None:
    det, _, _ = detector()
    now = time.time()
    det.node_disk(det.nodes[0], "no space left on device in ~/x", now)
    det.rank_exited(1, 1, now + 0.1)
    fault = det.outcome().node_fault
    assert fault is not None and fault.index == 0 and fault.why == "no space left on device in ~/x"


def test_a_node_killed_after_our_own_stop_or_an_interrupt_is_no_fault() -> None:
    det, stopper, _ = detector()
    det.rank_exited(0, 3, time.time())  # the job's error first
    stopper.begin(1, "rank 0 on a failed")
    det.rank_exited(2, 137, time.time() + 1, after_stop=True)  # our own SIGKILL
    assert det.outcome().node_fault is None
    det, stopper, _ = detector()
    stopper.interrupt(2)
    stopper.handle_signals()
    det.node_lost(det.nodes[1], "gone")
    assert det.outcome().node_fault is None


# --- spares and plans ------------------------------------------------------------------

HOSTS = "n0 slots=2\nn1 slots=2\nn2 slots=2\nn3 slots=1\n"


def test_the_last_hosts_are_the_spares_and_the_plan_shows_them() -> None:
    cluster = hold_spares(parse_hostfile(HOSTS, "h.txt"), 1)
    assert [h.name for h in cluster.hosts] == ["n0", "n1", "n2"]
    assert [h.name for h in cluster.spares] == ["n3"]
    plan = make_plan(cluster, spec(), "r1")
    assert plan.world_size == 6 and plan.spares == ("n3",)
    assert "spares:\n- n3\n" in plan_yaml(plan)
    assert hold_spares(cluster, 0) is cluster


def test_spares_that_leave_no_host_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"--spares 4 leaves no host to run on: 4 host\(s\)"):
        hold_spares(parse_hostfile(HOSTS, "h.txt"), 4)


def test_each_attempt_keeps_its_own_node_folders() -> None:
    assert node_dir("r1", 2) == "~/.orchestrator/runs/r1/node2"
    assert node_dir("r1", 2, attempt=3) == "~/.orchestrator/runs/r1/attempt3/node2"


# --- the pool ----------------------------------------------------------------------------


class Connection:
    def __init__(self, host: str) -> None:
        self.host = host
        self.address = host


class Probe:
    """Stands in for the preflight probe: `bad` hosts fail; records what it was asked."""

    def __init__(self, *bad: str) -> None:
        self.bad = set(bad)
        self.calls: list[list[str]] = []

    def __call__(self, cluster, connections, only) -> ProbeResult:
        names = [cluster.hosts[i].name for i in only]
        self.calls.append(names)
        facts = {
            i: NodeFacts(torch_version="2") for i in only if cluster.hosts[i].name not in self.bad
        }
        failed = {
            i: NodeError(cluster.hosts[i].name, "preflight probe failed (exit code 1)")
            for i in only
            if cluster.hosts[i].name in self.bad
        }
        return ProbeResult(facts, (), failed)


def pool(spares: int = 2, bad_nodes: str | None = None) -> tuple[NodePool, list[str]]:
    names = ["n0", "n1", "n2", *(f"s{i}" for i in range(spares))]
    cluster = hold_spares(parse_hostfile("\n".join(names) + "\n", "h.txt"), spares)
    connections = [Connection(h.name) for h in (*cluster.hosts, *cluster.spares)]
    notes: list[str] = []
    return NodePool(cluster, connections, "r1", bad_nodes, notes.append), notes


def test_a_node_fault_takes_the_next_spare_and_probes_it_with_the_master() -> None:
    p, notes = pool()
    probe = Probe()
    fault = NodeFault(1, "n1", "lost: gone", time.time())
    recovery = p.recover(fault, probe)
    assert recovery is not None and (recovery.node, recovery.spare) == ("n1", "s0")
    assert [h.name for h in p.cluster.hosts] == ["n0", "s0", "n2"]
    assert probe.calls == [["n0", "s0"]]  # the new node and the master (a fresh port)
    assert p.attempt == 2 and [h.name for h in p.cluster.spares] == ["s1"]
    assert p.connections[1].host == "s0"
    assert "n1 taken out (lost: gone); spare s0 takes node rank 1" in notes


def test_when_the_master_is_replaced_every_node_is_probed_again() -> None:
    p, _ = pool()
    probe = Probe()
    p.recover(NodeFault(0, "n0", "lost: gone", time.time()), probe)
    assert probe.calls == [["s0", "n1", "n2"]]


def test_a_spare_that_fails_its_probe_is_passed_over() -> None:
    p, _ = pool()
    probe = Probe("s0")
    recovery = p.recover(NodeFault(2, "n2", "lost: gone", time.time()), probe)
    assert [h.name for h in p.cluster.hosts] == ["n0", "n1", "s1"]
    assert recovery is not None and recovery.spare == "s1"
    assert probe.calls == [["n0", "s0"], ["n0", "s1"]]


def test_no_spare_that_passes_ends_the_run_with_the_probe_errors() -> None:
    p, _ = pool(spares=1)
    with pytest.raises(NodeErrors, match="s0: preflight probe failed"):
        p.recover(NodeFault(2, "n2", "lost: gone", time.time()), Probe("s0"))


def test_the_preflight_replaces_a_failing_host_and_drops_a_failing_spare() -> None:
    p, notes = pool()
    probe = Probe("n1", "s0")
    assert p.preflight(probe) == []
    assert [h.name for h in p.cluster.hosts] == ["n0", "s1", "n2"]
    assert p.cluster.spares == ()
    assert probe.calls == [["n0", "n1", "n2", "s0", "s1"], ["n0", "s1"]]
    assert p.recoveries[0].why == "preflight: preflight probe failed (exit code 1)"
    assert any(note.startswith("warning: spare s0: preflight probe failed") for note in notes)
    assert set(p.facts) == {0, 1, 2}


def test_each_probe_is_reported_once_for_the_node_timeline() -> None:
    p, _ = pool()
    before = time.time()
    p.preflight(Probe())
    probes = p.new_probes()
    assert set(probes) == {0, 1, 2}
    assert all(before <= began <= ended <= time.time() for began, ended in probes.values())
    assert p.new_probes() == {}  # a relaunch reports only the nodes probed again
    p.recover(NodeFault(1, "n1", "lost: gone", time.time()), Probe())
    assert set(p.new_probes()) == {0, 1}  # the spare, and the master for a fresh port


def test_more_failing_hosts_than_spares_fail_the_preflight_as_without_spares() -> None:
    p, _ = pool(spares=1)
    with pytest.raises(NodeErrors, match="preflight failed on 2 node"):
        p.preflight(Probe("n0", "n1"))
    p, _ = pool(spares=0)
    with pytest.raises(NodeErrors, match="n2: preflight probe failed"):
        p.preflight(Probe("n2"))


def test_the_final_summary_names_the_recoveries_or_why_no_spare_replaced_the_node() -> None:
    p, _ = pool(spares=1)
    p.recover(NodeFault(1, "n1", "lost: gone", time.time() - 5), Probe())
    p.running()
    ended = p.amend(Outcome("succeeded", 0))
    assert "recovered from 1 node fault(s) (--spares):" in ended.summary
    assert "n1 (lost: gone) replaced by s0 as node 1; running again" in ended.summary
    fault = NodeFault(2, "n2", "lost: gone again", time.time())
    assert not p.will_replace(Outcome("lost", 1, "job failed: node n2 was lost", fault))
    ended = p.amend(Outcome("lost", 1, "job failed: node n2 was lost", fault))
    assert "no spare left: --spares 1 used up (s0 replaced n1)" in ended.summary
    status = p.status()
    assert status["attempt"] == 2 and status["spares"] == []
    assert status["recoveries"][0]["seconds_to_running"] >= 5


# --- the bad-node list ---------------------------------------------------------------------


def test_bad_nodes_are_written_with_why_and_skipped_later(tmp_path: Path) -> None:
    path = str(tmp_path / "bad.txt")
    assert read_bad_nodes(path) == {}
    p, notes = pool(bad_nodes=path)
    p.recover(NodeFault(1, "n1", "lost: no word\nfor 30 s", time.time()), Probe())
    text = Path(path).read_text()
    assert text.startswith("# orchestrator's bad-node list")
    assert "run r1: lost: no word for 30 s" in text.splitlines()[-1]
    assert f"n1 added to the bad-node list {path}" in notes
    add_bad_node(path, "n2", "r2", "rank 4 killed by signal SIGKILL (exit code 137)")
    assert set(read_bad_nodes(path)) == {"n1", "n2"}
    cluster, skipped = skip_bad_nodes(parse_hostfile("n0\nn1\nn2\nn3\n", "h.txt"), path)
    assert [h.name for h in cluster.hosts] == ["n0", "n3"] and skipped == ["n1", "n2"]


def test_a_bad_node_list_that_leaves_nothing_or_is_garbled_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("n0\nn1  # by hand\n")
    with pytest.raises(ConfigError, match="every host of h.txt is in the bad-node list"):
        skip_bad_nodes(parse_hostfile("n0\nn1\n", "h.txt"), str(path))
    path.write_text("n0\nn1 n2\n")
    with pytest.raises(SourceError, match=r"bad.txt:2: 'n1 n2' is not a host name"):
        read_bad_nodes(str(path))


def test_a_host_that_cannot_be_reached_is_replaced_and_an_unreachable_spare_dropped() -> None:
    cluster = hold_spares(parse_hostfile("n0\nn1\nn2\ns0\ns1\n", "h.txt"), 2)
    connections = [Connection("n0"), None, Connection("n2"), None, Connection("s1")]
    notes: list[str] = []
    p = NodePool(cluster, connections, "r1", None, notes.append)
    p.replace_unreachable(
        {1: NodeError("n1", "no answer within 5 s"), 3: NodeError("s0", "no answer within 5 s")}
    )
    assert [h.name for h in p.cluster.hosts] == ["n0", "s1", "n2"] and p.cluster.spares == ()
    assert p.recoveries[0].why == "no answer within 5 s"
    assert "warning: spare s0: no answer within 5 s; it is not used" in notes
    p = NodePool(cluster, connections, "r1")
    with pytest.raises(NodeErrors, match="connecting failed on 3 node"):
        p.replace_unreachable({i: NodeError(f"h{i}", "refused") for i in (0, 1, 4)})


def test_rank_files_an_attempt_left_incomplete_stay_in_the_record_after_a_relaunch() -> None:
    p, _ = pool()
    first = {"incomplete_logs": [{"rank": 1, "node_dir": "~/.orchestrator/runs/r1/node1"}]}
    assert p.carry(first) == first
    p.recover(NodeFault(1, "n1", "lost: gone", time.time()), Probe())
    second = {"incomplete_logs": [{"rank": 1, "node_dir": "~/x/attempt2/node1"}]}
    merged = p.carry(second)["incomplete_logs"]
    assert [gap["node_dir"] for gap in merged] == [
        "~/.orchestrator/runs/r1/node1",
        "~/x/attempt2/node1",
    ]
    assert p.status()["incomplete_logs"] == merged
    assert p.carry({})["incomplete_logs"] == merged
