"""--bind-cores: the core sets per local rank (agent/programs/cores.py), pure and on this
machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.agent.programs import cores
from orchestrator.agent.programs.cores import (
    CoreSet,
    TooFewCores,
    Topology,
    core_sets,
    format_cpus,
    parse_cpus,
)
from orchestrator.errors import ConfigError
from orchestrator.hosts.hostfile import parse_hostfile
from orchestrator.plan.launch_plan import NodeFacts, make_plan
from orchestrator.plan.spec import JobSpec, Program


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 255), min_size=1))
def test_cpulist_round_trip(cpus: set[int]) -> None:
    assert parse_cpus(format_cpus(sorted(cpus))) == tuple(sorted(cpus))


def test_cpulist_format() -> None:
    assert format_cpus([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert parse_cpus("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)


topologies = st.builds(
    lambda cpus, cut: Topology(
        tuple(sorted(cpus)),
        tuple(
            (n, c) for n, c in ((0, tuple(sorted(cpus))[:cut]), (1, tuple(sorted(cpus))[cut:])) if c
        ),
    ),
    st.sets(st.integers(0, 63), min_size=1, max_size=64),
    st.integers(0, 64),
)


@settings(max_examples=300, deadline=None)
@given(topologies, st.integers(1, 70))
def test_sets_are_disjoint_cover_all_cores_and_are_balanced(topology: Topology, nproc: int) -> None:
    if nproc > len(topology.cpus):
        with pytest.raises(TooFewCores, match=f"{nproc} local ranks but only"):
            core_sets(topology, nproc)
        return
    sets = core_sets(topology, nproc)
    assert len(sets) == nproc
    flat = [cpu for s in sets for cpu in s.cpus]
    assert sorted(flat) == list(topology.cpus) and len(flat) == len(set(flat))
    assert max(len(s.cpus) for s in sets) - min(len(s.cpus) for s in sets) <= 1
    nodes = dict(topology.numa)
    for s in sets:
        if s.numa_node is not None:
            assert set(s.cpus) <= set(nodes[s.numa_node])
        else:  # only a share that spans nodes goes without one
            assert not any(set(s.cpus) <= set(c) for c in nodes.values())


def test_two_numa_nodes_keep_shares_within_a_node() -> None:
    topology = Topology.decode("0-7|0:0-1,4-5;1:2-3,6-7")
    assert [s.encode() for s in core_sets(topology, 2)] == ["0-1,4-5/0", "2-3,6-7/1"]
    assert [s.describe() for s in core_sets(topology, 4)][:2] == [
        "cores 0-1 (NUMA node 0)",
        "cores 4-5 (NUMA node 0)",
    ]
    assert Topology.decode(topology.encode()) == topology
    assert core_sets(Topology((0, 1, 2)), 2) == (CoreSet((0, 1)), CoreSet((2,)))


def test_read_topology_is_this_machines(tmp_path: Path) -> None:
    node = tmp_path / "node0"
    node.mkdir()
    (node / "cpulist").write_text(format_cpus(sorted(os.sched_getaffinity(0))) + ",4096\n")
    (tmp_path / "node1").mkdir()  # a node without cpulist is skipped
    topology = cores.read_topology(str(tmp_path))
    assert topology.cpus == tuple(sorted(os.sched_getaffinity(0)))
    assert topology.numa == ((0, topology.cpus),)  # cores we may not use are left out


def test_the_module_runs_standalone_as_the_nodes_run_it() -> None:
    source = Path(cores.__file__).read_text()
    done = subprocess.run(
        [sys.executable, "-", "topology"], input=source, text=True, capture_output=True, check=True
    )
    assert done.stdout.startswith("cores_topology=")
    many = len(os.sched_getaffinity(0)) + 1
    done = subprocess.run(
        [sys.executable, "-", "sets", str(many)], input=source, text=True, capture_output=True
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"orchestrator: error: --bind-cores: {many} local ranks")


def test_plan_refuses_more_ranks_than_probed_cores_naming_the_host() -> None:
    cluster = parse_hostfile("n1 slots=2\nn2 slots=3\n", "hosts.txt")
    spec = JobSpec(program=Program.from_argv([]), python="p", workdir="/w", bind_cores=True)
    two = NodeFacts(topology=Topology((0, 1)))
    with pytest.raises(
        ConfigError,
        match=r"^--bind-cores on n2 \(hosts.txt:2\): 3 local "
        r"ranks but only 2 usable core",
    ):
        make_plan(cluster, spec, "r", {0: two, 1: two})
    plan = make_plan(cluster, spec, "r", {0: two})
    assert plan.nodes[0].core_sets == (CoreSet((0,)), CoreSet((1,)))
    assert plan.nodes[1].core_sets is None  # not probed: computed by the script
