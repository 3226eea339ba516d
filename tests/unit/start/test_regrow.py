"""--min-nodes growing back from every source, without a cluster: hosts left out at the
start, lost during the run, or added to the hostfile are asked again; one that answers and
passes its probe joins at a checkpoint while the run is short of the hosts the launch
chose, or is held as a spare at full size; one that fails its probe (asked, or joining) is
put back among those asked, said once, and never ends the run; a hostfile edit is read with
the launch's parser, choice and bad-node list, a broken one said in one line naming
file:line. The probe and the connections are stand-ins (the boundary being the nodes); the
attempt is a stand-in recording its lines and checkpoint asks. End to end:
tests/cluster/test_shrink_cluster.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from orchestrator.errors import NodeError, NodeErrors
from orchestrator.hosts.hostfile import load_hostfile
from orchestrator.options.choosing import Selection
from orchestrator.options.supervision import Supervision
from orchestrator.plan.deadline import Deadline
from orchestrator.plan.launch_plan import make_plan
from orchestrator.record.bad_nodes import add_bad_node
from orchestrator.start.hostfile_watch import HostfileWatch
from orchestrator.start.joining import grow
from orchestrator.start.pool import NodePool
from orchestrator.start.regrow import Regrow
from orchestrator.start.settings import LaunchOptions
from tests.unit.plan.test_plan import spec
from tests.unit.start.test_recovery import Connection, Probe
from tests.unit.start.test_shrink import lost, replan


class Attempt:
    """Stands in for the supervisor of a running attempt: its lines and checkpoint asks."""

    def __init__(self) -> None:
        self.ended = threading.Event()
        self.lines: list[str] = []
        self.asked: list[str] = []
        self.sink = self

    def note(self, text: str) -> None:
        self.lines.append(text)

    def ask_checkpoint(self, why: str) -> None:
        self.asked.append(why)


def launched(hostfile: Path, hosts: int = 4, **selection) -> tuple[NodePool, list[str]]:
    """A pool launched from `hostfile` (written with n0..n{hosts-1}), --min-nodes 2."""
    hostfile.write_text("".join(f"n{i}\n" for i in range(hosts)))
    cluster = load_hostfile(hostfile)
    notes: list[str] = []
    pool = NodePool(
        cluster, [Connection(h.name) for h in cluster.hosts], "r1", None, notes.append, 2
    )
    pool.begin(make_plan(pool.cluster, spec(), "r1", pool.facts))
    return pool, notes


def regrow(pool: NodePool, probe: Probe, answering: set[str]) -> Regrow:
    watch = HostfileWatch.of(pool.base.path, Selection(), None)
    connect = lambda host: Connection(host.name) if host.name in answering else None  # noqa: E731
    return Regrow(pool, 10.0, probe, connect, watch)


def test_a_host_left_out_at_the_start_is_asked_and_joins_at_a_checkpoint(tmp_path) -> None:
    pool, notes = launched(tmp_path / "h.txt")
    pool.preflight(Probe("n3"))  # no torch there: left out, 3 of the 4 chosen run
    replan(pool)
    assert [h.name for h in pool.cluster.hosts] == ["n0", "n1", "n2"]
    assert [m.host.name for m in pool.gone] == ["n3"]
    probe = Probe("n3")
    asking, attempt = regrow(pool, probe, {"n3"}), Attempt()
    asking.round(attempt)  # it answers, but fails its probe as before: said once
    asking.round(attempt)
    assert attempt.lines == [
        "n3 answers but fails the preflight (preflight probe failed (exit code 1)); asked "
        "again every 10 s"
    ]
    assert probe.calls == [["n3"], ["n3"]] and not attempt.asked
    probe.bad.clear()  # torch installed: it passes, and the run grows to the 4 chosen
    asking.round(attempt)
    assert attempt.lines[-1] == "n3 back; growing to 4 nodes at the next checkpoint"
    assert attempt.asked == ["growing to 4 nodes"]
    asking.round(attempt)  # found: not asked again
    assert probe.calls[-1] == ["n3"] and len(probe.calls) == 3
    asking.settle()
    assert [m.host.name for m in pool.back] == ["n3"] and pool.gone == []
    grow(pool, Probe())
    assert [h.name for h in pool.cluster.hosts] == ["n0", "n1", "n2", "n3"]
    plan = replan(pool)
    assert plan.world_size == 4
    assert pool.status()["world"][-1]["why"] == "n3 back: 4 of 4 nodes"


def test_a_host_added_to_the_hostfile_joins_a_smaller_run_and_is_a_spare_of_a_full_one(
    tmp_path,
) -> None:
    hostfile = tmp_path / "h.txt"
    pool, notes = launched(hostfile)
    pool.recover(lost(1, "n1").node_fault, Probe())  # 3 of 4
    replan(pool)
    asking, attempt = regrow(pool, Probe(), {"n4", "n5"}), Attempt()
    asking.round(attempt)
    assert attempt.lines == []  # the hostfile did not change; n1 does not answer
    hostfile.write_text("n0\nn1\nn2\nn3\nn4 slots=2\n")
    asking.round(attempt)
    assert attempt.lines == [
        f"{hostfile} edited: asking n4 (added); each joins at a checkpoint while the run "
        "is on fewer than 4 nodes, else it is held as a spare",
        "n4 answers; growing to 4 nodes at the next checkpoint",
    ]
    hostfile.write_text("n0\nn1\nn2\nn3\nn4 slots=2\nn5\n")
    asking.round(attempt)  # at full size with n4: n5 is held as a spare
    assert (
        attempt.lines[-1]
        == "n5 answers; held as a spare (1 spare(s)): it replaces the next node lost"
    )
    assert attempt.asked == ["growing to 4 nodes"]
    asking.settle()
    assert [m.host.name for m in pool.back] == ["n4"]
    assert [m.host.name for m in pool.spares] == ["n5"] and pool.spare_count == 1
    grow(pool, Probe())
    plan = replan(pool)
    assert [(n.name, len(n.ranks)) for n in plan.nodes] == [
        ("n0", 1), ("n2", 1), ("n3", 1), ("n4", 2),
    ]  # fmt: skip
    # The next node lost is replaced by the spare, as one of --spares would be.
    outcome = lost(2, "n3")
    assert pool.will_replace(outcome)
    pool.recover(outcome.node_fault, Probe())
    assert [h.name for h in pool.cluster.hosts] == ["n0", "n2", "n5", "n4"]
    # n1 and n3 are still asked; n1 answering now, the run full, it is a spare too.
    asking = regrow(pool, Probe(), {"n1"})
    asking.round(attempt)
    assert (
        attempt.lines[-1] == "n1 back; held as a spare (1 spare(s)): it replaces the next node lost"
    )


def test_a_broken_hostfile_edit_is_one_line_and_the_run_goes_on(tmp_path) -> None:
    hostfile = tmp_path / "h.txt"
    pool, _ = launched(hostfile)
    pool.recover(lost(3, "n3").node_fault, Probe())
    asking, attempt = regrow(pool, Probe(), {"n4"}), Attempt()
    hostfile.write_text("n0\nn1\nn2\nn3\nn4 slots=many\n")
    asking.round(attempt)
    asking.round(attempt)  # the same broken text: not said again
    (line,) = attempt.lines
    assert line.startswith(f"{hostfile}:5: ") and "slots" in line, line
    assert line.endswith("(the edit is not taken; the run goes on with its hosts)")
    hostfile.unlink()  # an editor replacing it: said, and nothing else changes
    asking.round(attempt)
    assert attempt.lines[-1].startswith(f"{hostfile}: hostfile not found")
    hostfile.write_text("n0\nn1\nn2\nn3\nn4 slots=2\n")  # mended: n4 is added
    asking.round(attempt)
    assert attempt.lines[-1] == "n4 answers; growing to 4 nodes at the next checkpoint"
    assert [h.name for h in pool.cluster.hosts] == ["n0", "n1", "n2"]  # the pool waits


def test_an_edit_is_chosen_as_the_launch_chose(tmp_path) -> None:
    hostfile, bad = tmp_path / "h.txt", str(tmp_path / "bad.txt")
    hostfile.write_text("n0\nn1\nn2\nn9\n")
    watch = HostfileWatch.of(str(hostfile), Selection(exclude="n9", bad_nodes=bad), None)
    add_bad_node(bad, "n5", "r0", "lost")
    hostfile.write_text("n0\nn1\nn2\nn9\nn4\nn5\n")
    edit = watch.read()
    assert [h.name for h in edit.added] == ["n4"]  # n9 was there before, and excluded
    assert edit.lines == (
        f"{hostfile}: n5 added, but on the bad-node list {bad}: not taken (remove its line "
        "there to use it)",
    )
    assert watch.read().added == ()  # unchanged: nothing new
    watch = HostfileWatch.of(str(hostfile), Selection(num_nodes=3), None)
    hostfile.write_text("n0\nn1\nn2\nn9\nn4\nn6\n")
    edit = watch.read()
    assert edit.added == () and edit.lines == (
        f"{hostfile}: n6 added, but not chosen by --num-nodes 3: not taken",
    )


def test_a_host_that_fails_its_probe_when_joining_is_asked_again_and_the_run_goes_on(
    tmp_path,
) -> None:
    pool, notes = launched(tmp_path / "h.txt")
    pool.recover(lost(0, "n0").node_fault, Probe())
    replan(pool)
    asking, attempt = Regrow(pool, 10.0, Probe(), lambda h: Connection(h.name)), Attempt()
    asking.round(attempt)
    asking.settle()
    assert [m.host.name for m in pool.back] == ["n0"]
    grow(pool, Probe("n0"))  # its disk filled meanwhile
    assert [h.name for h in pool.cluster.hosts] == ["n1", "n2", "n3"]
    assert [m.host.name for m in pool.gone] == ["n0"] and pool.gone[0].connection is None
    assert notes[-1] == (
        "n0 back but failed the preflight (preflight probe failed (exit code 1)); going on "
        "with 3 of 4 nodes, asking it again later"
    )
    assert pool.attempt == 3  # the ranks stopped at their checkpoint: a new attempt
    plan = replan(pool)
    assert plan.nnodes == 3 and plan.attempt == 3
    assert pool.status()["world"][-1]["why"] == (
        "n0 back but failed the preflight (preflight probe failed (exit code 1)): 3 of 4 nodes"
    )
    # A survivor failing its probe then is no returning node: it ends the run, as before.
    asking.round(attempt)
    asking.settle()
    with pytest.raises(NodeErrors, match="n1: preflight probe failed"):
        grow(pool, Probe("n1"))


def test_the_asking_is_for_min_nodes_runs_without_a_time_limit(tmp_path) -> None:
    pool, _ = launched(tmp_path / "h.txt")
    options = LaunchOptions("r1", ())
    assert Regrow.of(pool, options, None, None) is not None
    timed = LaunchOptions("r1", (), deadline=Deadline(limit_s=60.0))
    assert Regrow.of(pool, timed, None, None) is None
    pool.min_nodes = None
    assert Regrow.of(pool, options, None, None) is None


def test_a_host_found_after_the_attempt_ended_waits_for_the_next(tmp_path) -> None:
    pool, _ = launched(tmp_path / "h.txt")
    pool.recover(lost(2, "n2").node_fault, Probe())
    attempt = Attempt()
    asking = Regrow(pool, 10.0, Probe(), lambda h: (attempt.ended.set(), Connection(h.name))[1])
    asking.round(attempt)
    asking.settle()
    assert pool.back == [] and [m.host.name for m in pool.gone] == ["n2"]
    assert attempt.lines == [] and attempt.asked == []


def test_an_error_while_asking_is_a_warning_line_not_a_traceback(tmp_path) -> None:
    pool, _ = launched(tmp_path / "h.txt")
    pool.recover(lost(1, "n1").node_fault, Probe())

    def probe(cluster, connections, only):
        raise NodeError("n1", "the agent sent garbage")

    attempt = Attempt()
    Regrow(pool, 10.0, probe, lambda h: Connection(h.name)).round(attempt)
    assert attempt.lines == ["warning: asking n1 again: n1: the agent sent garbage"]


def test_hosts_are_asked_every_30_s_or_twice_the_heartbeat_timeout_if_less() -> None:
    assert Supervision(heartbeat_timeout=5).ask_again_every == 10
    assert Supervision(heartbeat_timeout=60).ask_again_every == 30
    assert Supervision(heartbeat_timeout=0).ask_again_every == 30  # no heartbeats: the most
