"""The preflight proves the job's TCP paths on the namespace cluster: a node whose TCP to the
master is dropped on every port but SSH's, and two nodes that cannot reach each other (both
reach the master), are named before anything starts (exit 2), with iptables rules inside the
nodes' namespaces as shared/LAB.md's bad days make them; `check` shows the matrix."""

from __future__ import annotations

import contextlib
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_helpers import assert_nothing_left, run_cli
from tests.lab.cluster import Cluster, Node

pytestmark = pytest.mark.cluster

JOB = "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('started')\n"


@contextlib.contextmanager
def dropped(cluster: Cluster, *pairs: tuple[Node, Node]) -> Iterator[None]:
    """TCP from each pair's first node to its second dropped on every port but 22 (a rule in
    the first node's namespace: its replies to the second are dropped too)."""
    added: list[tuple[Node, list[str]]] = []
    try:
        for src, dst in pairs:
            rule = ["OUTPUT", "-d", dst.address, "-p", "tcp", "!", "--dport", "22", "-j", "DROP"]
            cluster.exec_in(src, ["iptables", "-A", *rule], check=True)
            added.append((src, rule))
        yield
    finally:
        for src, rule in added:
            cluster.exec_in(src, ["iptables", "-D", *rule])


def launch(cluster: Cluster, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    (tmp_path / "job.py").write_text(JOB)
    hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=1)
    run_id = f"paths-{uuid.uuid4().hex[:8]}"
    done = run_cli(
        ["launch", str(hostfile), "--run-dir", str(tmp_path / "runs"), "--run-id", run_id,
         "--color", "never", *args, "job.py", str(tmp_path / "started")],
        cwd=tmp_path, env=cluster.environ(), timeout=120,
    )  # fmt: skip
    return done, run_id


def assert_nothing_started(tmp_path: Path, run_id: str) -> None:
    assert not (tmp_path / "started").exists()
    assert not (tmp_path / "runs" / run_id).exists()  # no run record: the run never began
    assert_nothing_left(run_id)


def test_a_node_whose_tcp_to_the_master_is_dropped_is_named_in_seconds(
    cluster: Cluster, tmp_path: Path
) -> None:
    master, cut = cluster.nodes[0], cluster.nodes[2]
    with dropped(cluster, (cut, master)):
        started = time.monotonic()
        done, run_id = launch(cluster, tmp_path)
        took = time.monotonic() - started
    print(done.stderr, f"took {took:.1f} s")
    assert done.returncode == 2, done.stdout + done.stderr
    assert took < 10, took
    line = next(x for x in done.stderr.splitlines() if "cannot reach the master" in x)
    assert f"error: {cut.name}: cannot reach the master {master.name} at " in line, line
    assert f" at {master.address}:" in line and "no answer within 3 s" in line, line
    assert "Traceback" not in done.stderr
    assert_nothing_started(tmp_path, run_id)


def test_two_nodes_that_cannot_reach_each_other_are_named_as_a_pair(
    cluster: Cluster, tmp_path: Path
) -> None:
    a, b = cluster.nodes[1], cluster.nodes[2]
    with dropped(cluster, (a, b), (b, a)):
        started = time.monotonic()
        done, run_id = launch(cluster, tmp_path)
        took = time.monotonic() - started
    print(done.stderr, f"took {took:.1f} s")
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [x for x in done.stderr.splitlines() if "cannot reach" in x]
    assert len(lines) == 1, done.stderr  # one line for the pair, both ways
    assert f"{a.name}: cannot reach {b.name} at {b.address}:" in lines[0], lines[0]
    assert f"nor can {b.name} reach it at {a.address}:" in lines[0], lines[0]
    assert "no answer within 3 s" in lines[0] and "the master" not in lines[0]
    assert took < 15, took
    assert_nothing_started(tmp_path, run_id)


def test_the_paths_pass_and_the_job_runs(cluster: Cluster, tmp_path: Path) -> None:
    done, run_id = launch(cluster, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "paths: 9 TCP connection(s) made by the probe" in done.stdout, done.stdout
    assert (tmp_path / "started").read_text() == "started"
    skipped, _ = launch(cluster, tmp_path, "--no-path-check")
    assert skipped.returncode == 0 and "paths:" not in skipped.stdout, skipped.stdout


def test_check_shows_the_matrix_and_names_the_pair(cluster: Cluster, tmp_path: Path) -> None:
    from tests.cluster.test_check_cluster import assert_nothing_left as nothing_of_check
    from tests.cluster.test_check_cluster import run_check

    a, b = cluster.nodes[1], cluster.nodes[2]
    hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=1)
    with dropped(cluster, (a, b), (b, a)):
        run = run_check(cluster, tmp_path, hostfile, "--skip-bandwidth")
    print(run.stdout)
    assert run.returncode == 1, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    top = lines.index("PATHS (9 TCP connection(s), 2 failed)")
    assert lines[top + 1].split() == ["M", "0", "1", "2"]
    assert lines[top + 2].split() == [cluster.nodes[0].name, ".", ".", "."]
    assert lines[top + 3].split() == [a.name, ".", ".", "X"]
    assert lines[top + 4].split() == [b.name, ".", ".", "X"]
    problems = run.problems()
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{a.name}: cannot reach {b.name} at {b.address}:"), problems
    assert "COLLECTIVES: not run" in run.stdout
    nothing_of_check(cluster, run.run_id)


def test_an_interface_that_does_not_route_is_named_with_one_that_does(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A second interface (one end of a veth pair inside the node, with an address of another
    network) chosen by the hostfile on one node: the master's replies to it have no way
    back; the node's eth0 works. (This kernel has no dummy interfaces.)"""
    master, node = cluster.nodes[0], cluster.nodes[1]
    address = "198.18.7.1"  # benchmarking space (RFC 2544): nothing routes it here
    ns = ["ip", "-n", node.netns]
    subprocess.run([*ns, "link", "add", "pth0", "type", "veth", "peer", "name", "pth1"], check=True)
    try:
        subprocess.run([*ns, "addr", "add", f"{address}/24", "dev", "pth0"], check=True)
        for end in ("pth0", "pth1"):
            subprocess.run([*ns, "link", "set", end, "up"], check=True)
        (tmp_path / "job.py").write_text(JOB)
        hostfile = tmp_path / "hosts.txt"
        hostfile.write_text(
            "".join(
                f"{n.name} slots=1" + (" ifname=pth0" if n is node else "") + "\n"
                for n in cluster.nodes
            )
        )
        run_id = f"paths-{uuid.uuid4().hex[:8]}"
        done = run_cli(
            ["launch", str(hostfile), "--run-dir", str(tmp_path / "runs"), "--run-id", run_id,
             "job.py", str(tmp_path / "started")],
            cwd=tmp_path, env=cluster.environ(), timeout=120,
        )  # fmt: skip
    finally:
        subprocess.run([*ns, "link", "del", "pth0"])
    print(done.stderr)
    assert done.returncode == 2, done.stdout + done.stderr
    assert (
        f"{node.name}: cannot reach the master {master.name} at {master.address}:"
    ) in done.stderr
    assert f"from pth0 ({address})" in done.stderr
    assert f"eth0 ({node.address}) does reach it: set --ifname" in done.stderr
    assert_nothing_started(tmp_path, run_id)
