"""The path check's pure parts: which pairs are tried and what that covers, the failure
lines (both nodes, address and port, what happened), the matrix, and the argv each node
runs; and the node-side script itself, run here on loopback."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from orchestrator.errors import NodeErrors
from orchestrator.nodes.paths.found import (
    STORE,
    PathNode,
    failure_lines,
    matrix,
    read_report,
)
from orchestrator.nodes.paths.pairs import (
    ALL_PAIRS_UP_TO,
    PEERS_PER_NODE,
    choose_peers,
    incoming,
    pair_coverage,
    scheme,
)
from orchestrator.nodes.paths.prove import path_argvs, raise_failures, store_wait
from orchestrator.nodes.probe import parse_probe_output
from tests.factories import free_port


def nodes(n: int) -> list[PathNode]:
    return [PathNode(i, f"node{i}", "python3", f"10.0.0.{i + 1}", "eth0") for i in range(n)]


@pytest.mark.parametrize("n", [2, 3, 16, ALL_PAIRS_UP_TO])
def test_every_ordered_pair_up_to_the_limit(n: int) -> None:
    peers = choose_peers(n)
    assert {(i, j) for i, ts in enumerate(peers) for j in ts} == {
        (i, j) for i, j in itertools.permutations(range(n), 2)
    }
    assert pair_coverage(n) == 1.0 and f"({n * (n - 1)} peer paths)" in scheme(n)


@pytest.mark.parametrize("n", [ALL_PAIRS_UP_TO + 1, 128, 256])
def test_beyond_the_limit_ring_plus_random_peers(n: int) -> None:
    peers = choose_peers(n, seed="abc")
    assert peers == choose_peers(n, seed="abc") and peers != choose_peers(n, seed="abd")
    for i, targets in enumerate(peers):
        assert len(targets) == len(set(targets)) == PEERS_PER_NODE and i not in targets
        assert (i + 1) % n in targets  # the ring: every node reaches one and is reached
    into = incoming(peers)
    assert all(len(sources) >= 1 for sources in into)
    # What `pair_coverage` claims, counted over the draw.
    tested = {frozenset((i, j)) for i, ts in enumerate(peers) for j in ts}
    share = len(tested) / (n * (n - 1) / 2)
    assert share == pytest.approx(pair_coverage(n), abs=0.03)


def test_coverage_figures_in_the_docs() -> None:
    assert [round(pair_coverage(n), 2) for n in (128, 256, 1024)] == [0.75, 0.43, 0.12]


def test_incoming_is_the_transpose() -> None:
    assert incoming(((1, 2), (2,), ())) == ((), (0,), (0, 1))


def report_of(outputs: dict[int, str], n: int = 3):
    found = {i: parse_probe_output(text) for i, text in outputs.items()}
    return read_report(nodes(n), found, "10.0.0.1", 29500)


OK_STORE = "reach=ok\nreach_ms=0.1\n"


def test_a_node_that_cannot_reach_the_store_is_one_line_naming_both() -> None:
    report = report_of(
        {
            0: OK_STORE,
            1: "reach=error\nreach_error=no answer within 3 s\nsshd_port=ok\n",
            2: "reach=error\nreach_error=ECONNREFUSED (Connection refused) for 3 s\n"
            "sshd_port=ECONNREFUSED (Connection refused)\nreach_alt=ib0 10.1.0.3\n",
        }
    )
    assert failure_lines(report) == [
        (
            "node1",
            "cannot reach the master node0 at 10.0.0.1:29500 from eth0 (10.0.0.2): no answer "
            "within 3 s (its sshd port answers: a firewall blocks port 29500)",
        ),
        (
            "node2",
            "cannot reach the master node0 at 10.0.0.1:29500 from eth0 (10.0.0.3): refused for "
            "3 s; ib0 (10.1.0.3) does reach it: set --ifname (or ifname= in the hostfile) to it",
        ),
    ]
    assert report.failures[0].target == STORE


def test_a_pair_that_fails_both_ways_is_one_line() -> None:
    report = report_of(
        {
            0: OK_STORE + "peer_1=ok 0.1\npeer_2=ok 0.1\n",
            1: OK_STORE + "peer_0=ok 0.1\npeer_2=error 10.0.0.3:4000 no answer within 3 s\n",
            2: OK_STORE + "peer_0=ok 0.1\npeer_1=error 10.0.0.2:4001 EHOSTUNREACH (No route "
            "to host)\n",
        }
    )
    assert failure_lines(report) == [
        (
            "node1",
            "cannot reach node2 at 10.0.0.3:4000 from eth0 (10.0.0.2): no answer within 3 s; "
            "nor can node2 reach it at 10.0.0.2:4001: no route to host",
        )
    ]
    with pytest.raises(NodeErrors) as raised:
        raise_failures(report)
    assert raised.value.exit_code == 2
    assert str(raised.value) == "node1: " + failure_lines(report)[0][1]


def test_one_way_refused_and_an_isolated_node() -> None:
    one_way = report_of(
        {
            0: OK_STORE + "peer_1=error 10.0.0.2:4000 ECONNREFUSED (Connection refused)\n",
            1: OK_STORE + "peer_0=ok 0.1\n",
        },
        n=2,
    )
    assert failure_lines(one_way) == [
        ("node0", "cannot reach node1 at 10.0.0.2:4000 from eth0 (10.0.0.1): refused")
    ]
    n = 5
    outputs = {}
    for i in range(n):
        peers = [j for j in range(n) if j != i]
        outputs[i] = OK_STORE + "".join(
            f"peer_{j}=error 10.0.0.{j + 1}:4000 no answer within 3 s\n"
            if 4 in (i, j)
            else f"peer_{j}=ok 0.1\n"
            for j in peers
        )
    lines = failure_lines(report_of(outputs, n))
    assert lines == [
        (
            "node4",
            "reaches none of its 4 peers, e.g. node0 cannot reach node4 at 10.0.0.5:4000 "
            "from eth0 (10.0.0.1): no answer within 3 s",
        )
    ]


def test_many_failures_are_cut_short() -> None:
    n = 20
    outputs = {
        i: OK_STORE
        + "".join(
            f"peer_{j}=error 10.0.0.{j + 1}:4000 no answer within 3 s\n"
            if (i + j) % 2
            else f"peer_{j}=ok 0.1\n"
            for j in range(n)
            if j != i
        )
        for i in range(n)
    }
    lines = failure_lines(report_of(outputs, n), limit=12)
    assert len(lines) == 13 and lines[-1][0] == "cluster"
    assert lines[-1][1].startswith("and ") and lines[-1][1].endswith(
        "more path(s) that do not connect"
    )


def test_the_matrix() -> None:
    report = report_of(
        {
            0: OK_STORE + "peer_1=ok 0.1\npeer_2=ok 0.1\n",
            1: OK_STORE + "peer_0=ok 0.1\npeer_2=error 10.0.0.3:4000 no answer within 3 s\n",
            2: "reach=error\nreach_error=no answer within 3 s\n",
        }
    )
    assert matrix(report).splitlines() == [
        "       M 0 1 2",
        "node0  .   . .",
        "node1  . .   X",
        "node2  X - -",
        "(row: from, column: to; M: the master's store port; 0=node0, 1=node1, 2=node2)",
        "(. connected, X did not, - not tested)",
    ]


def test_argvs_quote_nothing_and_name_the_peers() -> None:
    argvs = path_argvs(nodes(3), "10.0.0.1", 29500, token="t", timeout=3)
    assert sorted(argvs) == [0, 1, 2]
    master = argvs[0]
    assert master[master.index("--listen") + 1] == "3"
    assert argvs[1][argvs[1].index("--peers") + 1] == "0,2"
    assert argvs[1][argvs[1].index("--from") + 1] == "0,2"
    assert "--listen" not in argvs[1] and "--serve" in argvs[1]
    assert argvs[1][argvs[1].index("--wait") + 1] == f"{store_wait(3, 3):g}"
    # the check's master that cannot take part still runs the store
    alone = path_argvs(nodes(3)[1:], "10.0.0.1", 29500, token="t", timeout=3)
    assert "--no-connect" in alone[0] and alone[0][alone[0].index("--listen") + 1] == "2"


def test_the_node_side_script_on_loopback() -> None:
    """Three 'nodes' on 127.0.0.1 and one whose peer port nothing answers."""
    group = [PathNode(i, f"n{i}", sys.executable, "127.0.0.1", "lo") for i in range(3)]
    argvs = path_argvs(group, "127.0.0.1", free_port(), token="tok", timeout=1)
    procs = {i: subprocess.Popen(a, stdout=subprocess.PIPE, text=True) for i, a in argvs.items()}
    outputs = {i: parse_probe_output(p.communicate(timeout=60)[0]) for i, p in procs.items()}
    report = read_report(group, outputs, "127.0.0.1", 0)
    assert report.ok, report.failures
    assert outputs[0]["heard"] == "0,1,2" and outputs[1]["peers_heard"] == "0,2"
    assert report.tested() == 9
