"""A path that breaks after the preflight is named at the start (agent/connects.py): on the
session's 3 nodes, with `--no-path-check` so that the preflight does not catch it first and
an iptables rule inside one node's namespace (tests/cluster/test_paths_cluster.py's
`dropped`), a job whose 3 ranks build a gloo mesh ends `unreachable`, exit 1, within 30 s of
its start, the line naming the node and the master's store port, or the pair; nothing is left
on any node. The same job without the rule forms its mesh and is never called unreachable."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from tests.cli_helpers import assert_nothing_left, run_cli, status_of
from tests.cluster.test_paths_cluster import dropped
from tests.lab.cluster import Cluster

pytestmark = pytest.mark.cluster

JOB = """\
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
print("mesh formed", flush=True)
"""
ENDED = re.compile(r"run (\S+) (\w+) \(exit code (\d+)\) after ([\d.]+) s")


def launch(cluster: Cluster, tmp_path: Path) -> tuple[str, str, float]:
    """The mesh job on every node with one rank each, no path check: (output, run id, how
    long after the start it ended, as the launch says)."""
    (tmp_path / "mesh.py").write_text(JOB)
    hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=1)
    run_id = f"unreach-{uuid.uuid4().hex[:8]}"
    done = run_cli(
        ["launch", str(hostfile), "--run-dir", str(tmp_path / "runs"), "--run-id", run_id,
         "--color", "never", "--no-path-check", "mesh.py"],
        cwd=tmp_path, env=cluster.environ(), timeout=180,
    )  # fmt: skip
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


def test_without_the_rule_the_mesh_forms_and_nothing_is_called_unreachable(
    cluster: Cluster, tmp_path: Path
) -> None:
    output, run_id, _ = launch(cluster, tmp_path)
    assert output.count("mesh formed") == 3 and "cannot reach" not in output, output
    assert status_of(tmp_path / "runs", run_id)["state"] == "succeeded"
