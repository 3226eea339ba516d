"""The planner: ranks, node ranks, master address/port, interfaces, env, secrets. Pure."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import ConfigError
from orchestrator.hosts.hostfile import Cluster, Host, parse_hostfile
from orchestrator.plan.launch_plan import IFNAME_VARS, LaunchPlan, NodeFacts, is_loopback, make_plan
from orchestrator.plan.spec import JobSpec, Program

PROPERTY = settings(max_examples=60, deadline=None)


def spec(**changes) -> JobSpec:
    values = {
        "program": Program.from_argv(["-m", "pkg.train"]),
        "python": "/usr/bin/python3",
        "workdir": "/work/dir",
    }
    return JobSpec(**{**values, **changes})


def plan_for(text: str, facts: dict | None = None, run_id: str = "run1", **changes) -> LaunchPlan:
    return make_plan(parse_hostfile(text, "hosts.txt"), spec(**changes), run_id, facts)


# --- ranks -------------------------------------------------------------------------------


def test_ranks_follow_slots_and_hostfile_order() -> None:
    plan = plan_for("b slots=2\na\nc:3\n")
    assert [(n.node_rank, n.name, n.nproc, list(n.ranks)) for n in plan.nodes] == [
        (0, "b", 2, [0, 1]),
        (1, "a", 1, [2]),
        (2, "c", 3, [3, 4, 5]),
    ]
    assert (plan.nnodes, plan.world_size) == (3, 6)
    assert plan.node_of_rank(4).name == "c"
    with pytest.raises(KeyError):
        plan.node_of_rank(6)


def test_nproc_per_node_overrides_slots_within_max_slots() -> None:
    plan = plan_for("a slots=8 max_slots=8\nb slots=1\n", nproc_per_node=4)
    assert [n.nproc for n in plan.nodes] == [4, 4] and plan.world_size == 8
    with pytest.raises(ConfigError) as info:
        plan_for("a\nb max_slots=2\n", nproc_per_node=3)
    assert str(info.value).startswith("hosts.txt:2: --nproc-per-node asks for 3 ranks on b")
    assert "max_slots=2" in str(info.value)


@st.composite
def clusters(draw) -> Cluster:
    count = draw(st.integers(1, 8))
    hosts = []
    for index in range(count):
        slots = draw(st.none() | st.integers(1, 16))
        max_slots = draw(st.none() | st.integers(16, 32))
        hosts.append(
            Host(f"node{index:02d}", slots=slots, max_slots=max_slots, source=f"h:{index + 1}")
        )
    order = draw(st.permutations(hosts))
    return Cluster(hosts=tuple(order), path="h")


@PROPERTY
@given(clusters(), st.none() | st.integers(1, 16))
def test_ranks_are_contiguous_and_cover_the_world_once(cluster: Cluster, nproc) -> None:
    plan = make_plan(cluster, spec(nproc_per_node=nproc), "r")
    ranks = [rank for node in plan.nodes for rank in node.ranks]
    assert ranks == list(range(plan.world_size))  # contiguous, ascending, each once
    assert [n.node_rank for n in plan.nodes] == list(range(len(cluster.hosts)))
    assert [n.host for n in plan.nodes] == list(cluster.hosts)  # hostfile order
    for node, host in zip(plan.nodes, cluster.hosts, strict=True):
        assert node.nproc == (nproc if nproc is not None else host.slots or 1)
        assert plan.node_of_rank(node.ranks.start) is node
    assert plan.to_dict()["world_size"] == plan.world_size


# --- master address and port -------------------------------------------------------------


def test_master_addr_choices_and_reasons() -> None:
    local = plan_for("localhost slots=2\n")
    assert local.master_addr == "127.0.0.1" and "this machine" in local.master_addr_reason
    named = plan_for("a\nb\n")
    assert (named.master_addr, named.master_addr_reason) == ("a", "first node in hosts.txt")
    probed = plan_for("a\nb\n", facts={0: NodeFacts(address="10.0.0.5")})
    assert probed.master_addr == "10.0.0.5" and "as reached by ssh" in probed.master_addr_reason
    given_addr = plan_for(
        "a\nb\n", facts={0: NodeFacts(address="10.0.0.5")}, master_addr="192.168.1.1"
    )
    assert (given_addr.master_addr, given_addr.master_addr_reason) == (
        "192.168.1.1",
        "--master-addr",
    )


@pytest.mark.parametrize(
    ("text", "changes"),
    [
        ("localhost\nnode2\n", {}),
        ("127.0.0.1\nnode2\n", {}),
        ("a\nb\n", {"master_addr": "127.0.0.1"}),
        ("a\nb\n", {"master_addr": "localhost"}),
        ("a\nb\n", {"master_addr": "127.1.2.3"}),
        ("a\nb\n", {"master_addr": "::1"}),
        ("a\nb\n", {"master_addr": "0:0:0:0:0:0:0:1"}),
        ("a\nb\n", {"master_addr": "::ffff:127.0.0.1"}),
        ("a\nb\n", {"master_addr": "LOCALHOST"}),
    ],
)
def test_loopback_master_in_a_multi_node_plan_is_refused(text: str, changes: dict) -> None:
    with pytest.raises(ConfigError) as info:
        plan_for(text, **changes)
    assert "loopback" in str(info.value) and "--master-addr" in str(info.value)


def test_loopback_master_is_fine_for_one_node() -> None:
    assert plan_for("a\n", master_addr="127.0.0.1").master_addr == "127.0.0.1"


@pytest.mark.parametrize(
    ("addr", "loopback"),
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("0::1", True),
        ("::ffff:127.0.0.2", True),
        ("10.0.0.1", False),
        ("node1", False),
        ("fd00::1", False),
        ("::ffff:10.0.0.1", False),
        ("", False),
    ],
)
def test_is_loopback(addr: str, loopback: bool) -> None:
    assert is_loopback(addr) is loopback


def test_master_port_choices_and_reasons() -> None:
    assert (plan_for("a\n").master_port, plan_for("a\n").master_port_reason) == (
        29500,
        "auto, not probed: the default",
    )
    free = plan_for("a\nb\n", facts={0: NodeFacts(free_port=41234)})
    assert (free.master_port, free.master_port_reason) == (
        41234,
        "auto: a port checked free on the master",
    )
    # facts of a node other than the master do not choose the port
    other = plan_for("a\nb\n", facts={1: NodeFacts(free_port=41234)})
    assert other.master_port == 29500
    explicit = plan_for("a\n", master_port=1234)
    assert (explicit.master_port, explicit.master_port_reason) == (
        1234,
        "--master-port (not checked)",
    )
    checked = plan_for("a\n", facts={0: NodeFacts(port_checked=True)}, master_port=1234)
    assert "checked free on the master" in checked.master_port_reason


# --- interfaces --------------------------------------------------------------------------


def ifname_env(node) -> dict[str, str]:
    return {k: v for k, v in node.env if k in IFNAME_VARS}


@PROPERTY
@given(
    st.none() | st.just("hosteth"), st.none() | st.just("flageth"), st.none() | st.just("probedeth")
)
def test_hostfile_ifname_wins_over_flag_over_probe(hostfile, flag, probed) -> None:
    text = "a" + (f" ifname={hostfile}" if hostfile else "") + "\nb\n"
    facts = {0: NodeFacts(ifname=probed, route_source="10.0.0.2")} if probed else {}
    node = plan_for(text, facts=facts, ifname=flag).nodes[0]
    expected = hostfile or flag or probed
    assert node.ifname == expected
    if expected is None:
        assert ifname_env(node) == {} and node.ifname_reason.startswith("not probed")
    else:
        assert ifname_env(node) == dict.fromkeys(IFNAME_VARS, expected)
        origin = (
            "hostfile (hosts.txt:1)"
            if hostfile
            else "--ifname"
            if flag
            else "probed: a reaches a from 10.0.0.2 via probedeth"
        )
        assert node.ifname_reason == origin


def test_each_node_gets_its_own_probed_ifname() -> None:
    plan = plan_for(
        "a\nb\nc ifname=ib0\n", facts={0: NodeFacts(ifname="eth0"), 1: NodeFacts(ifname="ens5")}
    )
    assert [n.ifname for n in plan.nodes] == ["eth0", "ens5", "ib0"]


def test_nodes_sharing_a_host_name_keep_their_own_facts() -> None:
    # Two sshds behind one gateway (port forwarding): one name, two nodes, two probes.
    plan = plan_for(
        "gw port=2201\ngw port=2202\n",
        facts={
            0: NodeFacts(address="10.0.0.1", ifname="eth0", free_port=41234),
            1: NodeFacts(ifname="ens5", free_port=50000),
        },
    )
    assert (plan.master_addr, plan.master_port) == ("10.0.0.1", 41234)
    assert [n.ifname for n in plan.nodes] == ["eth0", "ens5"]


def test_explicit_nccl_socket_ifname_env_is_kept() -> None:
    node = plan_for("a\n", ifname="eth0", env=(("NCCL_SOCKET_IFNAME", "^docker"),)).nodes[0]
    env = dict(node.env)
    assert env["NCCL_SOCKET_IFNAME"] == "^docker" and env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert [k for k, _ in node.env].count("NCCL_SOCKET_IFNAME") == 1


# --- env, secrets, workdir ---------------------------------------------------------------


def test_env_carries_user_values_then_run_id_without_duplicates() -> None:
    env = (("A", "1"), ("PYTHONUNBUFFERED", "0"), ("ORCHESTRATOR_RUN_ID", "x"), ("B", "2"))
    node = plan_for("a\n", env=env, run_id="r-7").nodes[0]
    names = [k for k, _ in node.env]
    assert len(names) == len(set(names)), names  # every variable exported once
    assert dict(node.env) == {
        "A": "1",
        "B": "2",
        "ORCHESTRATOR_RUN_ID": "r-7",
        "ORCHESTRATOR_LAUNCH_WORLD_SIZE": "1",
        "PYTHONUNBUFFERED": "1",
    }


def strings_in(data) -> list[str]:
    if isinstance(data, dict):
        return [s for k, v in data.items() for s in strings_in(k) + strings_in(v)]
    if isinstance(data, list | tuple):
        return [s for item in data for s in strings_in(item)]
    return [str(data)]


@PROPERTY
@given(
    st.text(min_size=1, max_size=20),
    st.sampled_from(["HF_TOKEN", "DB_PASSWORD", "MY_CUSTOM", "api_key"]),
)
def test_secrets_never_reach_the_plan(value: str, name: str) -> None:
    secret_value = "S3CRET" + value
    plan = plan_for(
        "a\nb\n",
        env=(("PUBLIC", "ok"), (name, secret_value)),
        secret_names=frozenset({"MY_CUSTOM"}),
    )
    assert plan.secret_names == (name,)
    assert all(name not in dict(node.env) for node in plan.nodes)
    assert not any(secret_value in text for text in strings_in(plan.to_dict()))
    assert plan.to_dict()["secrets"] == [name]
    assert all(dict(node.env)["PUBLIC"] == "ok" for node in plan.nodes)


def test_workdir_and_sync_dir() -> None:
    plan = plan_for("a\nb\n", run_id="r9")
    assert [n.workdir for n in plan.nodes] == ["/work/dir", "/work/dir"]
    assert [n.node_dir for n in plan.nodes] == [
        "~/.orchestrator/runs/r9/node0",
        "~/.orchestrator/runs/r9/node1",
    ]
    synced = plan_for("a\nb\n", run_id="r9", sync_dir="/home/me/proj/")
    assert [n.workdir for n in synced.nodes] == [
        "~/.orchestrator/runs/r9/node0/proj",
        "~/.orchestrator/runs/r9/node1/proj",
    ]
    assert synced.sync_dir == "/home/me/proj/" and synced.to_dict()["sync"] == "/home/me/proj/"


def test_python_from_hostfile_wins() -> None:
    plan = plan_for("a python=/opt/a/python\nb\n", python="/usr/bin/python3")
    assert [n.python for n in plan.nodes] == ["/opt/a/python", "/usr/bin/python3"]


def test_to_dict_shape() -> None:
    plan = plan_for("localhost slots=2\n", run_id="r1", env=(("A", "1"),))
    data = plan.to_dict()
    assert data["nodes"] == [
        {
            "node_rank": 0,
            "host": "localhost",
            "backend": "local",
            "ranks": "0-1",
            "nproc": 2,
            "python": "/usr/bin/python3",
            "workdir": "/work/dir",
            "ifname": "(detected at start)  # not probed: the node script picks the interface "
            "routing to 127.0.0.1",
            "omp_num_threads": "(at start: its usable cores / 2 local ranks, at least 1)  # "
            "unless OMP_NUM_THREADS is set there",
            "env": {
                "A": "1",
                "ORCHESTRATOR_RUN_ID": "r1",
                "ORCHESTRATOR_LAUNCH_WORLD_SIZE": "2",
                "PYTHONUNBUFFERED": "1",
            },
        }
    ]
    assert data["program"] == "-m pkg.train" and data["nnodes"] == 1
    assert data["master_port"] == "29500  # auto, not probed: the default"
    assert plan.is_local and not plan_for("a\n").is_local
