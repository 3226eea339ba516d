"""A path that breaks after the preflight is named at the start (agent/connects.py): on the
session's 3 nodes, with `--no-path-check` so that the preflight does not catch it first and
an iptables rule inside one node's namespace (tests/cluster/test_paths_cluster.py's
`dropped`), a job whose 3 ranks build a gloo mesh ends `unreachable`, exit 1, within 30 s of
its start, the line naming the node and the master's store port, or the pair; nothing is left
on any node. A slow start is not that: with node 0's processes frozen for 20 s as they
start (its store opens late), the same job forms its mesh and nothing is called unreachable.
Under SLURM (the lab's, 2 nodes), with the store's port on node 0 dropped from the others,
the agents in the allocation name it the same way and the job is cancelled."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_helpers import assert_nothing_left, run_cli, run_pids, start_cli, status_of
from tests.cluster.test_paths_cluster import dropped
from tests.lab.cluster import Cluster
from tests.lab.slurm import SlurmCluster
from tests.slurm_helpers import (  # noqa: F401 (a fixture, used by name)
    assert_gone,
    job_id_in,
    no_job_outlives_its_test,
    orchestrator,
)
from tests.slurm_helpers import launch_args as slurm_launch_args

pytestmark = pytest.mark.cluster

JOB = """\
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
print("mesh formed", flush=True)
"""
ENDED = re.compile(r"run (\S+) (\w+) \(exit code (\d+)\) after ([\d.]+) s")


def launch_args(cluster: Cluster, tmp_path: Path) -> tuple[list[str], str]:
    """The mesh job on every node with one rank each, no path check."""
    (tmp_path / "mesh.py").write_text(JOB)
    hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=1)
    run_id = f"unreach-{uuid.uuid4().hex[:8]}"
    return [
        "launch", str(hostfile), "--run-dir", str(tmp_path / "runs"), "--run-id", run_id,
        "--color", "never", "--no-path-check", "mesh.py",
    ], run_id  # fmt: skip


def launch(cluster: Cluster, tmp_path: Path) -> tuple[str, str, float]:
    """(output, run id, how long after the start it ended, as the launch says)."""
    args, run_id = launch_args(cluster, tmp_path)
    done = run_cli(args, cwd=tmp_path, env=cluster.environ(), timeout=180)
    output = done.stdout + done.stderr
    print(output)
    assert "Traceback (most recent call last)" not in done.stderr, output
    ended = ENDED.search(output)
    if done.returncode == 0:
        return output, run_id, 0.0
    assert ended is not None and ended.group(1) == run_id, output
    assert (ended.group(2), int(ended.group(3))) == ("unreachable", done.returncode), output
    return output, run_id, float(ended.group(4))


def test_a_node_that_cannot_reach_the_store_is_named_and_the_run_ends_unreachable(
    cluster: Cluster, tmp_path: Path
) -> None:
    master, cut = cluster.nodes[0], cluster.nodes[2]
    with dropped(cluster, (cut, master)):
        output, run_id, after = launch(cluster, tmp_path)
    assert after and after < 30, output
    said = [x for x in output.splitlines() if "cannot reach" in x]
    head = f"{cut.name} cannot reach the store on {master.name} at {master.address}:"
    assert said and head in said[0] and "got no answer for" in said[0], said
    assert status_of(tmp_path / "runs", run_id)["state"] == "unreachable"
    assert_nothing_left(run_id)


def test_a_pair_whose_ranks_cannot_connect_is_named(cluster: Cluster, tmp_path: Path) -> None:
    a, b = cluster.nodes[1], cluster.nodes[2]
    with dropped(cluster, (a, b)):  # b's SYNs to a get no reply either: a drops its SYN-ACKs
        output, run_id, after = launch(cluster, tmp_path)
    assert after and after < 30, output
    said = [x for x in output.splitlines() if "cannot reach" in x]
    pair = (
        f"{a.name} cannot reach a peer's port on {b.name} at {b.address}:",
        f"{b.name} cannot reach a peer's port on {a.name} at {a.address}:",
    )
    assert said and any(p in said[0] for p in pair), said
    assert "the store" not in output, output
    assert_nothing_left(run_id)


def node0_pids(run_id: str) -> list[int]:
    found = []
    for pid in run_pids(run_id):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(b"ORCHESTRATOR_NODE_DIR=") and e.endswith(b"/node0") for e in environ):
            found.append(pid)
    return found


def test_a_store_that_opens_late_is_a_slow_start_not_unreachable(
    cluster: Cluster, tmp_path: Path
) -> None:
    args, run_id = launch_args(cluster, tmp_path)
    proc = start_cli(args, cwd=tmp_path, env=cluster.environ())
    frozen: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while not frozen and time.monotonic() < deadline:
            frozen.update(node0_pids(run_id))
            time.sleep(0.05)
        assert frozen, "node 0's processes never started"
        until = time.monotonic() + 20
        while time.monotonic() < until:  # what node 0 starts meanwhile is frozen too
            for pid in set(node0_pids(run_id)) | frozen:
                frozen.add(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            time.sleep(0.2)
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    output = proc.communicate(timeout=180)[0]
    print(output)
    assert proc.returncode == 0, output
    assert "cannot reach" not in output, output
    logs = tmp_path / "runs" / run_id / "logs"
    assert all("mesh formed" in (logs / f"rank-{r}.log").read_text() for r in range(3)), output
    assert status_of(tmp_path / "runs", run_id)["state"] == "succeeded"


STORE_PORT = 29555  # --master-port: SLURM's own traffic between nodes uses other ports


@contextlib.contextmanager
def store_dropped(cluster: Cluster) -> Iterator[None]:
    """Every node's TCP to node 0's store port dropped (SLURM's own traffic goes on)."""
    master = cluster.nodes[0]
    rule = ["OUTPUT", "-d", master.address, "-p", "tcp", "--dport", str(STORE_PORT), "-j", "DROP"]
    try:
        for node in cluster.nodes[1:]:
            cluster.exec_in(node, ["iptables", "-A", *rule], check=True)
        yield
    finally:
        for node in cluster.nodes[1:]:
            cluster.exec_in(node, ["iptables", "-D", *rule])


@pytest.mark.slurm
def test_under_slurm_the_agents_name_it_and_the_job_is_cancelled(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    (tmp_path / "mesh.py").write_text(JOB)
    args = slurm_launch_args(
        tmp_path, "mesh", "--nodes", "2", "--nproc-per-node", "1", "--partition", "debug",
        "--master-port", str(STORE_PORT), "--", "mesh.py",
    )  # fmt: skip
    with store_dropped(slurm_cluster.cluster):
        done = orchestrator(slurm_cluster, tmp_path, *args, timeout=240)
    print(done.stdout, done.stderr)
    assert done.returncode == 1, done.stdout + done.stderr
    said = [x for x in done.stdout.splitlines() if "cannot reach the store on" in x]
    assert said and f":{STORE_PORT}: torchrun's connection got no answer" in said[0], said
    assert "run mesh unreachable (exit code 1)" in done.stdout, done.stdout
    assert status_of(tmp_path / "runs", "mesh")["state"] == "unreachable"
    assert_gone(slurm_cluster, job_id_in(done.stdout), "mesh")
