"""Host lists compressed for the console (`ceon[1-64]`), read back by the hostfile's own
range expansion."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.hostlist import compress_hosts, expand_range, name_ranks


def split_list(text: str) -> list[str]:
    """'a[1-2,4],b' -> ['a[1-2,4]', 'b']: commas outside brackets separate hosts."""
    return re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text)


def test_runs_ranges_padding_and_plain_names() -> None:
    assert compress_hosts(f"ceon{i}" for i in range(1, 65)) == "ceon[1-64]"
    assert compress_hosts(["node01", "node02", "node07", "node10", "login"]) == (
        "node[01-02,07,10],login"
    )
    assert compress_hosts(["n1", "n3", "n2", "n5", "n3"]) == "n[1-3,5]"
    assert compress_hosts(["gpu7"]) == "gpu7"
    assert compress_hosts(["x9", "x10", "x11"]) == "x[9-11]"
    assert compress_hosts(["a-1.lan", "a-2.lan"]) == "a-[1-2].lan"


def test_a_set_of_ranks_is_named_one_way_folded_or_listed() -> None:
    hosts = {0: "node1", 1: "node1", 2: "node2", 5: "node3"}
    assert name_ranks([3]) == "rank 3"
    assert name_ranks([2], hosts) == "rank 2 (node2)"
    assert name_ranks([0, 1, 2, 5], hosts) == "ranks r[0-2,5] (node[1-3])"
    assert name_ranks([0, 1, 2, 5]) == "ranks r[0-2,5]"
    assert name_ranks([0, 1, 2, 5], counted=True) == "4 ranks (r[0-2,5])"  # the hang notes
    assert name_ranks([3], counted=True) == "rank 3"
    assert name_ranks([1, 2, 9], hosts, listed=2) == "rank 1 on node1, rank 2 on node2 and 1 more"
    assert name_ranks([9], hosts, listed=2) == "rank 9"


@given(
    st.lists(
        st.tuples(st.sampled_from(["ceon", "gpu-", "n"]), st.integers(0, 300), st.booleans()),
        min_size=1,
        max_size=40,
    )
)
def test_the_list_expands_back_to_the_same_hosts(entries) -> None:
    names = [f"{p}{n:03d}" if pad else f"{p}{n}" for p, n, pad in entries]
    compressed = compress_hosts(names)
    back = [host for part in split_list(compressed) for host in expand_range(part)]
    assert sorted(back) == sorted(set(names)), compressed


def test_the_preflight_summary_is_one_line_when_the_nodes_agree() -> None:
    from orchestrator.hosts.hostfile import parse_hostfile
    from orchestrator.plan.launch_plan import NodeFacts
    from orchestrator.start.preflight import versions_summary

    cluster = parse_hostfile("".join(f"ceon{i}\n" for i in range(1, 65)), "h.txt")
    same = NodeFacts(python_version="3.11.7", torch_version="2.13.0+cpu")
    facts = dict.fromkeys(range(64), same)
    assert versions_summary(cluster, facts) == ["64 node(s): python 3.11.7, torch 2.13.0+cpu"]
    facts[4] = facts[9] = NodeFacts(python_version="3.11.7", torch_version="2.4.0")
    assert versions_summary(cluster, facts) == [
        "ceon[1-4,6-9,11-64]: python 3.11.7, torch 2.13.0+cpu",
        "ceon[5,10]: python 3.11.7, torch 2.4.0",
    ]


def test_sync_says_one_line_per_file_count_and_counts_nodes_on_the_progress_line() -> None:
    import io

    from orchestrator.console.progress import Progress
    from orchestrator.errors import NodeErrors
    from orchestrator.hosts.hostfile import parse_hostfile
    from orchestrator.plan.launch_plan import make_plan
    from orchestrator.plan.spec import JobSpec, Program
    from orchestrator.start.sync import sync_code

    class Connection:
        def __init__(self, files: int | None) -> None:
            self.files = files

        def put_tree(self, local: str, remote: str) -> int:
            if self.files is None:
                raise OSError("No space left on device")
            return self.files

    cluster = parse_hostfile("".join(f"ceon{i}\n" for i in range(1, 9)), "h.txt")
    program = Program.from_argv(["train.py"])
    spec = JobSpec(program=program, python="python3", workdir="/w", sync_dir="/src/proj")
    plan = make_plan(cluster, spec, "r1", None)
    notes: list[str] = []
    out = io.BytesIO()
    progress = Progress(out, tty=True)
    sync_code(plan, [Connection(12 if i != 5 else 3) for i in range(8)], notes.append, progress)
    assert notes == [
        "ceon[1-5,7-8]: synced 12 file(s) to each node's run folder "
        f"({plan.nodes[0].workdir} on ceon1, ...)",
        f"ceon6: synced 3 file(s) to {plan.nodes[5].workdir}",
    ]
    assert b"[orchestrator] syncing: 8/8 nodes" in out.getvalue()
    notes.clear()
    with pytest.raises(NodeErrors, match="ceon3: copying /src/proj .* No space left"):
        sync_code(plan, [Connection(None if i == 2 else 1) for i in range(8)], notes.append)
    assert notes == [
        f"ceon[1-2,4-8]: synced 1 file(s) to each node's run folder "
        f"({plan.nodes[0].workdir} on ceon1, ...)"
    ]
