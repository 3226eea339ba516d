"""`orchestrator check` on the namespace cluster: a passing check of 3 nodes x 2 slots with
exact values and a bandwidth table, and the faults it must diagnose by name (an unreachable
node, a blocked route or port to the master, a useless interface, a node without torch).
Every test ends by asserting that nothing of the check is left running on any node."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.check import measure
from orchestrator.sizes import format_size
from tests.lab.cluster import Cluster

pytestmark = pytest.mark.cluster


@dataclass
class CheckRun:
    returncode: int
    stdout: str
    stderr: str
    run_id: str
    run_dir: Path
    report: dict | None
    seconds: float

    def problems(self) -> list[str]:
        return self.report["problems"] if self.report else []


def run_check(
    cluster: Cluster, tmp_path: Path, hostfile: Path, *args: str, timeout: float = 300
) -> CheckRun:
    run_id = f"check-{uuid.uuid4().hex[:8]}"
    run_dir = tmp_path / "runs"
    report = tmp_path / f"{run_id}.json"
    argv = [
        sys.executable,
        "-m",
        "orchestrator",
        "check",
        str(hostfile),
        "--run-dir",
        str(run_dir),
        "--run-id",
        run_id,
        "--json",
        str(report),
        *args,
    ]
    started = time.monotonic()
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=cluster.environ(), cwd=tmp_path
    )
    seconds = time.monotonic() - started
    document = json.loads(report.read_text()) if report.exists() else None
    return CheckRun(done.returncode, done.stdout, done.stderr, run_id, run_dir, document, seconds)


def assert_nothing_left(cluster: Cluster, run_id: str) -> None:
    deadline = time.monotonic() + 10
    while cluster.pids_with_env("ORCHESTRATOR_RUN_ID", run_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = cluster.processes_with_env("ORCHESTRATOR_RUN_ID", run_id)
    assert left == [], [f"{p.node}: {p.command}" for p in left]


def table_row(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(name + " "))


def rank_records(run: CheckRun, world_size: int) -> dict[int, list[dict]]:
    logs = run.run_dir / run.run_id / "logs"
    return {
        rank: measure.parse_report_lines((logs / f"rank-{rank}.log").read_text().splitlines())
        for rank in range(world_size)
    }


def test_check_passes_on_three_nodes_with_exact_values_and_bandwidth(
    cluster: Cluster, tmp_path: Path
) -> None:
    hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=2)
    run = run_check(cluster, tmp_path, hostfile)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "RESULT: passed (3 node(s), 6 rank(s), gloo)" in run.stdout
    print(run.stdout)
    print(f"check took {run.seconds:.1f} s")

    # Node facts: every node reached, on eth0 with its own address, TCP to the master ok.
    master = cluster.nodes[0]
    assert f"TCP TO {master.address}:29500" in run.stdout
    for node, facts in zip(cluster.nodes, run.report["nodes"], strict=True):
        row = table_row(run.stdout, node.name)
        assert f"eth0 {node.address}" in row and " ms " in row and "!" not in row, row
        assert facts["ssh_rtt_ms"] > 0 and facts["probe"]["torch_version"]
        assert facts["reach"]["reach"] == "ok"
    assert run.report["nodes"][0]["reach"]["heard"] == "0,1,2"

    # The collectives: every case ok, and the exact values each rank reported.
    assert [(c["op"], c["ok"]) for c in run.report["collectives"]] == [
        (op, True) for op in measure.OPS for _ in (1, 2)
    ] + [("barrier", True)]
    records = rank_records(run, 6)
    for rank, found in records.items():
        results = {(r["op"], r["case"]): r for r in found if r["kind"] == "result"}
        assert results[("all_reduce", "scalar")]["got"] == [15]
        assert results[("reduce_scatter", "scalar")]["got"] == [15]
        assert results[("all_gather", "scalar")]["got"] == [0, 1, 2, 3, 4, 5]
        assert results[("broadcast", "scalar")]["got"] == [6]
        assert all(r["ok"] for r in results.values()) and len(results) == 9, rank
    starts = [next(r for r in found if r["kind"] == "start") for found in records.values()]
    assert {s["world_size"] for s in starts} == {6} and {s["backend"] for s in starts} == {"gloo"}

    # Bandwidth: 1K to 64M for both ops, nccl-tests' formulas, plausible numbers.
    rows = run.report["bandwidth"]
    sizes = measure.sweep_sizes(64 << 20)
    assert [r["size_bytes"] for r in rows if r["op"] == "all_reduce"] == sizes
    assert [r["size_bytes"] for r in rows if r["op"] == "all_gather"] == [
        measure.bytes_moved("all_gather", measure.elements_per_rank("all_gather", s, 6), 6)
        for s in sizes
    ]
    for row in rows:
        seconds = row["time_us"] / 1e6
        assert 0 < seconds < 30, row
        assert row["algbw_gbs"] == pytest.approx(row["size_bytes"] / seconds / 1e9)
        factor = 2 * 5 / 6 if row["op"] == "all_reduce" else 5 / 6
        assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * factor)
        assert row["algbw_gbs"] < 100  # veth pairs on one machine, not a supercomputer
    for op in measure.BANDWIDTH_OPS:  # big messages move more bytes per second than tiny ones
        by_op = [r for r in rows if r["op"] == op]
        assert by_op[-1]["algbw_gbs"] > 10 * by_op[0]["algbw_gbs"], op
    lines = run.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("BANDWIDTH (gloo, 6 ranks"))
    table = lines[start + 1 : lines.index("", start)]
    assert table[0].split() == [
        "OP",
        "SIZE",
        "COUNT",
        "ITERS",
        "TIME(us)",
        "ALGBW(GB/s)",
        "BUSBW(GB/s)",
    ]
    assert len(table) == 1 + 2 * len(sizes)
    assert [line.split()[1] for line in table[1 : 1 + len(sizes)]] == [
        format_size(s) for s in sizes
    ]

    # The check's job is an ordinary run.
    status = json.loads((run.run_dir / run.run_id / "status.json").read_text())
    assert status["state"] == "succeeded" and status["world_size"] == 6
    assert "orchestrator.check.collectives" in status["program"]
    listing = subprocess.run(
        [sys.executable, "-m", "orchestrator", "runs", "--run-dir", str(run.run_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.run_id in listing.stdout and "succeeded" in listing.stdout
    assert_nothing_left(cluster, run.run_id)


def test_check_with_a_selection_runs_only_the_selected_slots(
    cluster: Cluster, tmp_path: Path
) -> None:
    """DeepSpeed's --include out of a shared 3-host hostfile with slots=4: the check says
    what was selected, probes and runs only those hosts, one rank per chosen slot id, each
    rank seeing its node's chosen ids as CUDA_VISIBLE_DEVICES."""
    hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=4)
    first, skipped, last = (node.name for node in cluster.nodes[:3])
    include = f"{first}:1,3@{last}:2"
    run = run_check(cluster, tmp_path, hostfile, "--include", include, "--skip-bandwidth")
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"[check] 2 node(s), 3 rank(s) from {hostfile} (--include {include})" in run.stdout
    assert "RESULT: passed (2 node(s), 3 rank(s), gloo)" in run.stdout
    assert run.report["selection"] == f"--include {include}"
    assert [(n["host"], n["slots"], n["slot_ids"]) for n in run.report["nodes"]] == [
        (first, 2, [1, 3]),
        (last, 1, [2]),
    ]
    assert "0/2 (1,3)" in table_row(run.stdout, first) and not any(
        line.startswith(skipped + " ") for line in run.stdout.splitlines()
    )
    assert all(row["ok"] for row in run.report["collectives"])
    status = json.loads((run.run_dir / run.run_id / "status.json").read_text())
    assert [(r["host"], r["local_rank"]) for r in status["ranks"]] == [
        (first, 0),
        (first, 1),
        (last, 0),
    ]
    starts = {
        rank: next(r for r in found if r["kind"] == "start")
        for rank, found in rank_records(run, 3).items()
    }
    assert [(s["local_rank"], s["cuda_visible_devices"]) for s in starts.values()] == [
        (0, "1,3"),
        (1, "1,3"),
        (0, "2"),
    ]
    assert not (run.run_dir / run.run_id / "logs" / "rank-3.log").exists()
    assert_nothing_left(cluster, run.run_id)


def unused_address(cluster: Cluster) -> str:
    taken = {node.address for node in cluster.nodes} | {cluster.bridge_address}
    hosts = list(ipaddress.ip_network(cluster.subnet).hosts())
    return next(str(a) for a in reversed(hosts) if str(a) not in taken)


@pytest.mark.parametrize("how", ["no such host", "link cut"])
def test_an_unreachable_node_is_named_within_the_ssh_timeout(
    cluster: Cluster, tmp_path: Path, how: str
) -> None:
    if how == "no such host":
        name = unused_address(cluster)
        hostfile = tmp_path / "hosts.txt"
        hostfile.write_text(
            "".join(f"{n.name} slots=2\n" for n in cluster.nodes[:2]) + f"{name} slots=2\n"
        )
        run = run_check(cluster, tmp_path, hostfile, "--connect-timeout", "3")
    else:
        name = cluster.nodes[2].name
        hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=2)
        with cluster.link_cut(cluster.nodes[2]):
            run = run_check(cluster, tmp_path, hostfile, "--connect-timeout", "3")
    assert run.returncode == 1, run.stdout + run.stderr
    assert table_row(run.stdout, name).split()[1:3] == ["unreachable", "!"]
    assert [p for p in run.problems() if p.startswith(f"{name}: unreachable over SSH: ")]
    assert "COLLECTIVES: not run" in run.stdout
    assert run.report["nodes"][2]["ssh_error"]
    # The other nodes were still probed, and the whole check ended soon after the timeout.
    assert run.report["nodes"][1]["probe"]["torch_version"] in table_row(
        run.stdout, cluster.nodes[1].name
    )
    assert run.seconds < 3 + 45, run.seconds
    assert_nothing_left(cluster, run.run_id)


def test_a_node_with_a_blocked_route_to_the_master(cluster: Cluster, tmp_path: Path) -> None:
    master, cut = cluster.nodes[0], cluster.nodes[1]
    hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=2)
    with cluster.blocked(cut, master):
        run = run_check(cluster, tmp_path, hostfile)
    assert run.returncode == 1, run.stdout + run.stderr
    problems = run.problems()
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{cut.name}: cannot reach {master.address}:29500 ")
    assert "set --ifname" in problems[0]
    assert table_row(run.stdout, cut.name).split()[-3:-1] == ["FAILED", "!"]
    for node in (master, cluster.nodes[2]):
        assert " ok " in table_row(run.stdout, node.name)
    assert "COLLECTIVES: not run" in run.stdout
    assert not (run.run_dir / run.run_id).exists()  # no job was started
    assert run.seconds < 60, run.seconds
    assert_nothing_left(cluster, run.run_id)


def test_a_port_blocked_on_the_master(cluster: Cluster, tmp_path: Path) -> None:
    master = cluster.nodes[0]
    port = 29500 + 100 + uuid.uuid4().int % 200
    hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=2)
    blocks = [cluster.block(node, master, port=port) for node in cluster.nodes[1:]]
    try:
        run = run_check(cluster, tmp_path, hostfile, "--master-port", str(port))
    finally:
        for block in blocks:
            cluster.unblock(block)
    assert run.returncode == 1, run.stdout + run.stderr
    others = ", ".join(n.name for n in cluster.nodes[1:])
    assert run.problems() == [
        f"{master.name}: TCP port {port} on {master.address} is not reachable from {others} "
        f"(EACCES (Permission denied)) although its sshd port 22 is: a firewall blocks port "
        f"{port}. Open TCP port {port} on {master.name}, or pick an open one with "
        "--master-port"
    ]
    assert_nothing_left(cluster, run.run_id)


def test_an_interface_that_cannot_reach_the_master_and_a_node_without_torch(
    cluster: Cluster, tmp_path: Path
) -> None:
    bare = tmp_path / "python-without-site-packages"
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    master, wrong, torchless = cluster.nodes
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text(
        f"{master.name} slots=2\n{wrong.name} slots=2 ifname=lo\n"
        f"{torchless.name} slots=2 python={bare}\n"
    )
    run = run_check(cluster, tmp_path, hostfile)
    assert run.returncode == 1, run.stdout + run.stderr
    problems = run.problems()
    assert [
        p
        for p in problems
        if p.startswith(f"{wrong.name}: cannot reach {master.address}:29500 from lo (127.0.0.1): ")
    ]
    assert [
        p for p in problems if p.startswith(f"{torchless.name}: torch is not installed for {bare}")
    ]
    assert len(problems) == 2, problems
    assert "COLLECTIVES: not run" in run.stdout
    assert_nothing_left(cluster, run.run_id)
