"""Selecting hosts and slots (--include/--exclude/--num-nodes/--num-gpus), DeepSpeed's way.

Property tests against a direct model of DeepSpeed's rules, examples from its docs, and
every contradiction as bad input naming the flag and the host.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import ConfigError
from orchestrator.hosts.hostfile import parse_hostfile
from orchestrator.hosts.selection import select_hosts
from orchestrator.options.choosing import Selection
from orchestrator.plan.launch_plan import make_plan
from orchestrator.plan.spec import JobSpec, Program

HOSTS = "worker-0 slots=4\nworker-1 slots=4\nworker-2 slots=4\n"


def chosen(selection: Selection, text: str = HOSTS, nproc: int | None = None) -> dict:
    cluster = select_hosts(parse_hostfile(text, "hosts.txt"), selection, nproc)
    return {h.name: h.slot_ids for h in cluster.hosts}


def test_deepspeed_examples() -> None:
    assert chosen(Selection(include="worker-0@worker-1:0,2")) == {
        "worker-0": (0, 1, 2, 3),
        "worker-1": (0, 2),
    }
    assert chosen(Selection(exclude="worker-1:0")) == {
        "worker-0": (0, 1, 2, 3),
        "worker-1": (1, 2, 3),
        "worker-2": (0, 1, 2, 3),
    }
    assert chosen(Selection(exclude="worker-1")) == {
        "worker-0": (0, 1, 2, 3),
        "worker-2": (0, 1, 2, 3),
    }
    assert chosen(Selection(num_nodes=2)) == {"worker-0": (0, 1, 2, 3), "worker-1": (0, 1, 2, 3)}
    assert chosen(Selection(num_gpus=2)) == {f"worker-{i}": (0, 1) for i in range(3)}
    assert chosen(Selection(num_nodes=1, num_gpus=3)) == {"worker-0": (0, 1, 2)}


def test_hostfile_order_is_kept_and_slots_are_sorted_once() -> None:
    assert list(chosen(Selection(include="worker-2:3,1,1@worker-0:2"))) == ["worker-0", "worker-2"]
    assert chosen(Selection(include="worker-2:3,1,1"))["worker-2"] == (1, 3)


def test_no_selection_changes_nothing() -> None:
    cluster = parse_hostfile(HOSTS, "hosts.txt")
    assert select_hosts(cluster, Selection()) is cluster


def test_nproc_per_node_sets_the_slots_to_choose_from() -> None:
    assert chosen(Selection(include="worker-0:5"), nproc=6) == {"worker-0": (5,)}
    assert chosen(Selection(include="a"), "a\nb\n") == {"a": (0,)}  # a bare host: one slot


@pytest.mark.parametrize(
    ("selection", "message"),
    [
        (Selection(include="worker-0", exclude="worker-1"), r"^--include and --exclude together"),
        (Selection(include="worker-0", num_nodes=1), r"^--num-nodes with --include"),
        (Selection(exclude="worker-0", num_gpus=1), r"^--num-gpus with --exclude"),
        (
            Selection(include="worker-9:0"),
            r"^--include 'worker-9:0': host 'worker-9' is not in "
            r"hosts.txt \(hosts: worker-0, worker-1, worker-2\)",
        ),
        (
            Selection(exclude="worker-1:4"),
            r"^--exclude 'worker-1:4': host worker-1 has no slot 4 "
            r"\(its slots are 0-3; hosts.txt:2\)",
        ),
        (Selection(include="worker-1:x"), r"slot 'x' of host worker-1 is not a slot id"),
        (Selection(include="worker-1:"), r"slot '' of host worker-1 is not a slot id"),
        (Selection(include=""), r"^--include is empty"),
        (Selection(exclude="worker-0@worker-1@worker-2"), r"leaves no slot on any host"),
        (Selection(num_nodes=4), r"^--num-nodes 4: hosts.txt lists only 3 host"),
        (Selection(num_gpus=5), r"^--num-gpus 5: host worker-0 \(hosts.txt:1\) has 4 slot"),
        (Selection(num_gpus=0), r"^--num-gpus must be a positive integer, got 0"),
        (Selection(num_nodes=-1), r"^--num-nodes must be a positive integer"),
    ],
)
def test_contradictions_are_bad_input(selection: Selection, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        chosen(selection)
    assert info.value.exit_code == 2


slot_sets = st.lists(st.sets(st.integers(0, 3)), min_size=3, max_size=3)


def spec_of(picks: list[set[int]], whole: list[bool]) -> str:
    parts = []
    for index, (slots, all_slots) in enumerate(zip(picks, whole, strict=True)):
        if all_slots:
            parts.append(f"worker-{index}")
        elif slots:
            parts.append(f"worker-{index}:" + ",".join(map(str, sorted(slots))))
    return "@".join(parts)


@settings(max_examples=200, deadline=None)
@given(slot_sets, st.lists(st.booleans(), min_size=3, max_size=3))
def test_include_and_exclude_match_the_model(picks: list[set[int]], whole: list[bool]) -> None:
    """include keeps exactly what it names; exclude keeps exactly the rest; both disjoint."""
    text = spec_of(picks, whole)
    named = {f"worker-{i}": set(range(4)) if whole[i] else picks[i] for i in range(3)}
    if not text:
        return
    included = chosen(Selection(include=text))
    assert included == {h: tuple(sorted(s)) for h, s in named.items() if s}
    rest = {h: tuple(sorted(set(range(4)) - s)) for h, s in named.items()}
    rest = {h: s for h, s in rest.items() if s}
    if not rest:
        with pytest.raises(ConfigError):
            chosen(Selection(exclude=text))
        return
    excluded = chosen(Selection(exclude=text))
    assert excluded == rest
    for host in set(included) & set(excluded):
        assert not set(included[host]) & set(excluded[host])


@settings(max_examples=50, deadline=None)
@given(
    st.sampled_from(["worker-0@worker-1:0,2", "worker-1:3", "worker-0:1@worker-2"]),
    st.integers(1, 3),
)
def test_plan_ranks_follow_the_selection(include: str, nodes: int) -> None:
    """nproc = chosen slots, CUDA_VISIBLE_DEVICES = their ids, ranks contiguous in order."""
    cluster = select_hosts(parse_hostfile(HOSTS, "hosts.txt"), Selection(include=include))
    spec = JobSpec(
        program=Program.from_argv([]),
        python="python3",
        workdir="/w",
        env=(("CUDA_VISIBLE_DEVICES", "9"),),
    )
    plan = make_plan(cluster, spec, "r")
    assert plan.selection == f"--include {include}"
    start = 0
    for node in plan.nodes:
        assert node.nproc == len(node.host.slot_ids)
        assert dict(node.env)["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, node.host.slot_ids))
        assert [k for k, _ in node.env].count("CUDA_VISIBLE_DEVICES") == 1
        assert node.ranks.start == start
        start = node.ranks.stop
    assert plan.world_size == start


def test_without_selection_no_visible_devices_are_set() -> None:
    plan = make_plan(
        parse_hostfile(HOSTS, "hosts.txt"),
        JobSpec(program=Program.from_argv([]), python="p", workdir="/w"),
        "r",
    )
    assert all("CUDA_VISIBLE_DEVICES" not in dict(n.env) for n in plan.nodes)
    assert "selection" not in plan.to_dict()
