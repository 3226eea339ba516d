"""--min-nodes without a cluster: the option as the Python API takes it, and
ORCHESTRATOR_LAUNCH_WORLD_SIZE, the world a run was launched with, in every rank's
environment over SSH and under SLURM (one function computes it for both)."""

from __future__ import annotations

import pytest

import orchestrator
from orchestrator.errors import ConfigError
from orchestrator.hosts.hostfile import parse_hostfile
from orchestrator.options.scheduler import SlurmOptions
from orchestrator.plan.launch_plan import LAUNCH_WORLD_SIZE, make_plan
from orchestrator.slurm.batch.planning import plan_slurm_job
from tests.unit.plan.test_plan import spec

HOSTS = "n0 slots=2\nn1 slots=2\nn2 slots=1\n"


def test_the_api_refuses_a_floor_above_the_hosts(tmp_path) -> None:
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text(HOSTS)
    with pytest.raises(ConfigError, match=r"--min-nodes 4 is more than the 3 node\(s\)"):
        orchestrator.render(hostfile, ["train.py"], out_dir=tmp_path / "out", min_nodes=4)
    with pytest.raises(ConfigError, match="--min-nodes must be a positive integer, got 0"):
        orchestrator.render(hostfile, ["train.py"], out_dir=tmp_path / "out", min_nodes=0)
    written = orchestrator.render(
        hostfile, ["-m", "pkg"], out_dir=tmp_path / "out", min_nodes=3, forward_env=False
    )
    assert written  # a floor of every node is taken


def test_every_node_is_told_the_world_it_was_launched_with() -> None:
    cluster = parse_hostfile(HOSTS, "h.txt")
    plan = make_plan(cluster, spec(), "r1")
    assert {dict(node.env)[LAUNCH_WORLD_SIZE] for node in plan.nodes} == {"5"}
    assert plan.world_size == 5
    # The same run after losing n1: two nodes, three ranks, launched with five.
    survivors = parse_hostfile("n0 slots=2\nn2 slots=1\n", "h.txt")
    shrunk = make_plan(survivors, spec(), "r1", attempt=2, launched_with=[2, 2, 1])
    assert shrunk.world_size == 3
    assert {dict(node.env)[LAUNCH_WORLD_SIZE] for node in shrunk.nodes} == {"5"}


def test_a_users_own_launch_world_is_not_exported_twice() -> None:
    cluster = parse_hostfile(HOSTS, "h.txt")
    plan = make_plan(cluster, spec(env=((LAUNCH_WORLD_SIZE, "99"),)), "r1")
    names = [name for name, _ in plan.nodes[0].env]
    assert names.count(LAUNCH_WORLD_SIZE) == 1 and dict(plan.nodes[0].env)[LAUNCH_WORLD_SIZE] == "5"


def test_the_slurm_job_exports_nodes_times_ranks_per_node() -> None:
    job = plan_slurm_job(spec(nproc_per_node=4), SlurmOptions(nodes=3), "r1")
    assert dict(job.env)[LAUNCH_WORLD_SIZE] == "12"
