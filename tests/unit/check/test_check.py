"""Unit tests of `orchestrator check`'s pure parts: sizes, nccl-tests' bandwidth formulas,
the exact values every rank must get, report lines, diagnoses and tables. Plus the probe
script it ships to nodes, rendered and run here where it fails fast; the probe with torch
and orchestrator.check.reach run here in tests/local (test_probes_local, test_reach_local)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import sizes
from orchestrator.check import measure
from orchestrator.check.diagnose import node_problems
from orchestrator.check.facts import choose_backend
from orchestrator.check.report import bandwidth_table, node_table
from orchestrator.check.results import Problem, collective_results
from tests.check_helpers import MASTER, facts, node

GOLDEN = Path(__file__).resolve().parents[2] / "golden"


# --- sizes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("64M", 64 << 20),
        ("1G", 1 << 30),
        ("1g", 1 << 30),
        ("512K", 512 << 10),
        ("512KiB", 512 << 10),
        ("4096", 4096),
        ("2MB", 2 << 20),
        (" 1.5K ", 1536),
        ("1T", 1 << 40),
    ],
)
def test_parse_size_reads_binary_units(text: str, size: int) -> None:
    assert sizes.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "M", "-1M", "0", "64X", "1e6", "64 MB extra"])
def test_parse_size_rejects_what_is_not_a_size(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        sizes.parse_size(text)


def test_sweep_doubles_from_1k_to_the_max_inclusive() -> None:
    swept = measure.sweep_sizes(64 << 20)
    assert swept[0] == 1024 and swept[-1] == 64 << 20 and len(swept) == 17
    assert all(b == 2 * a for a, b in itertools.pairwise(swept))
    assert measure.sweep_sizes(3000) == [1024, 2048, 3000]  # the max is always measured
    assert measure.sweep_sizes(1024) == [1024]
    assert measure.sweep_sizes(100) == [100]
    assert [sizes.format_size(s) for s in (1024, 3 << 20, 1 << 30, 3000)] == [
        "1K",
        "3M",
        "1G",
        "3000",
    ]


def test_all_gather_size_is_the_gathered_total_rounded_to_whole_elements() -> None:
    # 1 KiB over 6 ranks: 42 float32 each, 1008 bytes gathered (as nccl-tests rounds).
    assert measure.elements_per_rank("all_gather", 1024, 6) == 42
    assert measure.bytes_moved("all_gather", 42, 6) == 1008
    assert measure.elements_per_rank("all_reduce", 1024, 6) == 256
    assert measure.bytes_moved("all_reduce", 256, 6) == 1024
    assert measure.elements_per_rank("all_gather", 4, 8) == 1  # never zero


# --- bandwidth formulas ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "all_reduce", "all_gather"),
    [
        (1, 0.0, 0.0),
        (2, 1.0, 0.5),
        (4, 1.5, 0.75),
        (6, 10 / 6, 5 / 6),
        (8, 1.75, 0.875),
    ],
)
def test_bus_factors_are_nccl_tests(n: int, all_reduce: float, all_gather: float) -> None:
    assert measure.bus_factor("all_reduce", n) == pytest.approx(all_reduce)
    assert measure.bus_factor("all_gather", n) == pytest.approx(all_gather)


def test_algbw_and_busbw_in_gb_per_second() -> None:
    # 1 GB in 0.5 s: 2 GB/s algorithm bandwidth; on 8 ranks all_reduce moves 1.75x that.
    assert measure.algbw_gbs(10**9, 0.5) == pytest.approx(2.0)
    assert measure.busbw_gbs("all_reduce", 10**9, 0.5, 8) == pytest.approx(3.5)
    assert measure.busbw_gbs("all_gather", 10**9, 0.5, 8) == pytest.approx(1.75)
    row = measure.BandwidthRow("all_gather", 64 << 20, (64 << 20) // 24, 0.25, 6, 1, 3)
    assert row.algbw == pytest.approx((64 << 20) / 0.25 / 1e9)
    assert row.busbw == pytest.approx(row.algbw * 5 / 6)
    assert row.to_dict()["time_us"] == pytest.approx(250000.0)
    with pytest.raises(ValueError):
        measure.algbw_gbs(1024, 0.0)
    with pytest.raises(ValueError):
        measure.bus_factor("all_to_all", 4)


def test_timed_iterations_fit_a_time_budget_within_bounds() -> None:
    assert measure.timed_iterations(0.001) == measure.MAX_ITERS  # tiny messages: 20, as nccl-tests
    assert measure.timed_iterations(0.05) == 5
    assert measure.timed_iterations(3.0) == measure.MIN_ITERS  # huge or slow: never fewer than 2
    assert measure.timed_iterations(0.0) == measure.MAX_ITERS
    assert measure.warmup_iterations(1024) == 2 and measure.warmup_iterations(64 << 20) == 1


def test_bandwidth_table_shows_sizes_times_and_both_bandwidths() -> None:
    rows = [
        measure.BandwidthRow("all_reduce", 1 << 20, 1 << 18, 0.001, 4, 2, 10),
        measure.BandwidthRow("all_gather", 1008, 42, 0.0005, 6, 5, 20),
    ]
    text = bandwidth_table(rows)
    assert text.splitlines()[0].split() == [
        "OP",
        "SIZE",
        "COUNT",
        "ITERS",
        "TIME(us)",
        "ALGBW(GB/s)",
        "BUSBW(GB/s)",
    ]
    assert text.splitlines()[1].split() == [
        "all_reduce",
        "1M",
        "262144",
        "10",
        "1000.0",
        "1.049",
        "1.573",
    ]
    assert text.splitlines()[2].split()[1] == "1008"


# --- expected values ---------------------------------------------------------------------


def simulate(op: str, inputs: list[list[list[int]]], root: int) -> list[list[int]]:
    """Reference semantics of each collective over every rank's input chunks."""
    n = len(inputs)
    if op == "all_reduce":
        total = [sum(col) for col in zip(*(chunks[0] for chunks in inputs), strict=True)]
        return [total] * n
    if op == "reduce_scatter":
        return [
            [sum(col) for col in zip(*(chunks[j] for chunks in inputs), strict=True)]
            for j in range(n)
        ]
    if op == "all_gather":
        gathered = [x for chunks in inputs for x in chunks[0]]
        return [gathered] * n
    if op == "broadcast":
        return [inputs[root][0]] * n
    raise AssertionError(op)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 7])
@pytest.mark.parametrize("op", measure.OPS)
def test_expected_values_match_what_the_collective_computes(op: str, n: int) -> None:
    scalar = [
        [[measure.scalar_input(op, r, n)]] * (n if op == "reduce_scatter" else 1) for r in range(n)
    ]
    for rank, result in enumerate(simulate(op, scalar, root=0)):
        assert result == measure.expected_scalar(op, rank, n)
    vector = [measure.vector_input(op, r, n, length=13) for r in range(n)]
    for rank, result in enumerate(simulate(op, vector, root=measure.broadcast_root(n))):
        assert result == measure.expected_vector(op, rank, n, length=13)


def test_the_classic_values_for_four_ranks() -> None:
    assert [measure.expected_scalar("all_reduce", r, 4) for r in range(4)] == [[6]] * 4
    assert [measure.expected_scalar("reduce_scatter", r, 4) for r in range(4)] == [[6]] * 4
    assert measure.expected_scalar("all_gather", 2, 4) == [0, 1, 2, 3]
    assert measure.expected_scalar("broadcast", 3, 4) == [4]
    assert measure.describe_expected("all_gather", "scalar", 4) == "[0, 1, 2, 3] on every rank"


def test_patterns_differ_per_rank_chunk_and_index() -> None:
    values = {
        measure.pattern(r, c, i)
        for r in range(8)
        for c in range(8)
        for i in range(measure.PATTERN_LENGTH)
    }
    assert len(values) == 8 * 8 * measure.PATTERN_LENGTH


def test_first_mismatch_names_the_element() -> None:
    assert measure.first_mismatch([1, 2, 3], [1, 2, 3]) is None
    found = measure.first_mismatch([1, 9, 3, 8], [1, 2, 3, 4])
    assert (found.index, found.got, found.expected, found.wrong) == (1, 9, 2, 2)
    assert found.describe() == "element 1 is 9, must be 2 (2 element(s) wrong)"
    assert measure.first_mismatch([1], [1, 2]).describe() == "got 1 element(s), expected 2"


def test_a_rank_reports_a_corrupted_element_of_a_collective() -> None:
    """run_case (the rank side) with real tensors and a one-rank 'dist' that corrupts."""
    torch = pytest.importorskip("torch")
    from orchestrator.check.collectives import run_case

    class OneRank:
        def all_reduce(self, tensor):
            pass

        def reduce_scatter(self, output, inputs):
            output.copy_(inputs[0])

        def all_gather(self, outputs, tensor):
            outputs[0].copy_(tensor)
            if len(tensor) > 17:  # the vector case: one element goes wrong
                outputs[0][17] += 1

        def broadcast(self, tensor, src):
            pass

    for op in measure.OPS:
        for case in ("scalar", "vector"):
            got, expected = run_case(torch, OneRank(), op, case, 0, 1, torch.device("cpu"))
            mismatch = measure.first_mismatch(got, expected)
            if op == "all_gather" and case == "vector":
                assert mismatch.describe() == "element 17 is 18, must be 17"
            else:
                assert mismatch is None, (op, case)


# --- report lines and the collectives summary --------------------------------------------


def test_report_lines_round_trip_through_prefixed_logs() -> None:
    record = {
        "kind": "result",
        "op": "all_reduce",
        "case": "scalar",
        "rank": 3,
        "ok": True,
        "got": [15],
    }
    line = measure.report_line(record)
    assert line.startswith(measure.MARKER) and "\n" not in line
    lines = ["noise", f"[node1 r3] {line}", f"{measure.MARKER}{{broken", f"{measure.MARKER}[1]"]
    assert measure.parse_report_lines(lines) == [record]


def results_for(world: int, skip: set[int] = frozenset()) -> dict[int, list[dict]]:
    records = {}
    for rank in range(world):
        if rank in skip:
            records[rank] = []
            continue
        records[rank] = [
            {
                "kind": "result",
                "op": op,
                "case": case,
                "rank": rank,
                "ok": True,
                **({"got": measure.expected_scalar(op, rank, world)} if case == "scalar" else {}),
            }
            for op in measure.OPS
            for case in ("scalar", "vector")
        ] + [{"kind": "result", "op": "barrier", "case": "", "rank": rank, "ok": True}]
    return records


HOSTS6 = {r: f"node{r // 2}" for r in range(6)}


def test_every_case_ok_on_every_rank() -> None:
    rows, problems = collective_results(results_for(6), 6, HOSTS6)
    assert problems == []
    assert [(r.op, r.case) for r in rows][:2] == [
        ("all_reduce", "scalar"),
        ("all_reduce", "vector"),
    ]
    assert len(rows) == 9 and all(r.ok and r.result == "ok on 6/6 ranks" for r in rows)
    assert rows[0].expected == "15 on every rank"


def test_a_wrong_value_names_the_rank_and_the_op() -> None:
    records = results_for(6)
    bad = next(r for r in records[3] if r["op"] == "all_gather" and r["case"] == "vector")
    bad.update(ok=False, mismatch="element 17 is 5, must be 15")
    rows, problems = collective_results(records, 6, HOSTS6)
    assert [str(p) for p in problems] == [
        "rank 3 (node1): all_gather (vector): element 17 is 5, must be 15"
    ]
    row = next(r for r in rows if (r.op, r.case) == ("all_gather", "vector"))
    assert not row.ok and row.result == "WRONG on rank 3"


def test_the_controller_rechecks_scalar_values_itself() -> None:
    records = results_for(4)
    lying = next(r for r in records[2] if r["op"] == "broadcast" and r["case"] == "scalar")
    lying["got"] = [0]  # the rank says ok, the value says otherwise
    _, problems = collective_results(records, 4, {r: "n" for r in range(4)})
    assert [str(p) for p in problems] == ["rank 2 (n): broadcast (scalar): got [0], must be [4]"]


def test_missing_ranks_and_rank_errors_are_reported() -> None:
    records = results_for(6, skip={4, 5})
    records[4] = [
        {
            "kind": "error",
            "rank": 4,
            "phase": "init_process_group",
            "error": "timed out after 180 s during init_process_group",
        }
    ]
    rows, problems = collective_results(records, 6, HOSTS6)
    assert rows[0].result == "no result from rank 4-5"
    assert [str(p) for p in problems] == [
        "rank 4 (node2): failed during init_process_group: timed out after 180 s during "
        "init_process_group"
    ]


# --- node diagnoses ----------------------------------------------------------------------


def test_a_healthy_cluster_has_no_problems() -> None:
    nodes = [node(i) for i in range(3)]
    assert node_problems(nodes, MASTER, "gloo") == []
    assert choose_backend(nodes) == ("gloo", "no CUDA devices")


def test_unreachable_node_and_node_without_torch_are_named() -> None:
    nodes = [
        node(0),
        node(1, ssh_error="no answer from 10.0.0.9:22 within 10 s", probe={}, reach={}),
        node(2, probe={"python_version": "3.11.7", "torch_error": "No module named 'torch'"}),
    ]
    problems = [str(p) for p in node_problems(nodes, MASTER, "gloo")]
    assert problems[0] == "node1: unreachable over SSH: no answer from 10.0.0.9:22 within 10 s"
    assert problems[1].startswith(
        "node2: torch is not installed for /usr/bin/python3 "
        "(python 3.11.7: No module named 'torch'); install it there"
    )


def test_a_node_that_cannot_reach_the_master_port_is_told_what_to_do() -> None:
    cut = {
        "reach": "error",
        "reach_error": "EHOSTUNREACH (No route to host)",
        "sshd_port": "EHOSTUNREACH (No route to host)",
    }
    nodes = [node(0), node(1), node(2), node(3, reach=cut)]
    problems = node_problems(nodes, MASTER, "gloo")
    assert [str(p) for p in problems] == [
        "node3: cannot reach 10.0.0.1:29500 from eth1 (10.0.0.3): EHOSTUNREACH (No route to "
        "host); set --ifname (or ifname= in the hostfile) to an interface that routes to "
        "10.0.0.1, or fix the route/firewall between them"
    ]
    assert problems[0].blocks_job
    table = node_table(nodes, MASTER, problems, "gloo")
    assert "FAILED !" in table.splitlines()[4] and "FAILED" not in table.splitlines()[3]


def test_a_port_blocked_on_the_master_is_told_apart_from_a_bad_route() -> None:
    blocked = {
        "reach": "error",
        "reach_error": "ECONNREFUSED (Connection refused) for 5 s",
        "sshd_port": "ok",
    }
    nodes = [node(0), node(1, reach=blocked), node(2, reach=blocked)]
    problems = [str(p) for p in node_problems(nodes, MASTER, "gloo")]
    assert problems == [
        "node0: TCP port 29500 on 10.0.0.1 is not reachable from node1, node2 (ECONNREFUSED "
        "(Connection refused) for 5 s) although its sshd port 22 is: a firewall blocks port "
        "29500. Open TCP port 29500 on node0, or pick an open one with --master-port"
    ]
    # Only one node of several: a block on the way to that node, said for that node.
    problems = [
        str(p) for p in node_problems([node(0), node(1, reach=blocked), node(2)], MASTER, "gloo")
    ]
    assert problems[0].startswith("node1: cannot reach 10.0.0.1:29500 from eth1 (10.0.0.3)")
    assert "open TCP port 29500 on node0 to this node" in problems[0]


def test_master_port_in_use_and_missing_interface() -> None:
    master = node(0, probe=facts(port="29500", port_free="no"), reach={})
    missing = node(1, probe=facts(ifname="eth9", ifname_exists="no", ifname_addr=""), reach={})
    problems = [str(p) for p in node_problems([master, missing], MASTER, "gloo")]
    assert problems == [
        "node0: MASTER_PORT 29500 is already in use on the master; pick another --master-port, "
        "or --master-port auto",
        "node1: network interface 'eth9' does not exist here; check --ifname / the hostfile's "
        "ifname= (`ip -br link` lists them)",
    ]
    listen = node(0, reach={"listen_error": "EADDRINUSE (Address already in use)"})
    assert (
        str(node_problems([listen], MASTER, "gloo")[0])
        == "node0: cannot listen on MASTER_PORT 29500: EADDRINUSE (Address already in use); "
        "pick another --master-port"
    )


def test_mismatches_are_flagged_but_do_not_block_the_job() -> None:
    nodes = [
        node(0),
        node(1, probe=facts(torch_version="2.4.0")),
        node(2, probe=facts(python_version="3.10.14", disk_free_kb="1024")),
    ]
    problems = node_problems(nodes, MASTER, "gloo")
    texts = [str(p) for p in problems]
    assert "node2: only 1.0M free in /home/u/.orchestrator/runs" in texts[0]
    assert texts[1].startswith(
        "cluster: torch versions differ between nodes (node0 2.3.1, node1 2.4.0, node2 2.3.1)"
    )
    assert texts[2].startswith(
        "cluster: python versions differ between nodes (node0 3.11, node1 3.11, node2 3.10)"
    )
    assert not any(p.blocks_job for p in problems)
    table = node_table(nodes, MASTER, problems, "gloo").splitlines()
    assert all("2.3.1 !" in line or "2.4.0 !" in line for line in table[1:])
    assert "1.0M !" in table[3]


def test_problem_text() -> None:
    assert (
        str(Problem("node3", "cannot reach 10.0.0.1:29500")) == "node3: cannot reach 10.0.0.1:29500"
    )


# --- what runs on the nodes, run here ----------------------------------------------------


def render_probe(**context: object) -> str:
    from orchestrator.plan.scripts import render_template

    base = {
        "host": "node0",
        "python": sys.executable,
        "master_addr": "127.0.0.1",
        "ifname": None,
        "is_master": True,
        "port": None,
        "default_port": 29500,
    }
    return render_template("check_probe.sh.j2", **{**base, **context})


def test_probe_script_golden() -> None:
    """The rendered probe, as it reaches a node; UPDATE_GOLDEN=1 rewrites the file."""
    text = render_probe(
        host="node0",
        python="/opt/py 3/bin/python",
        master_addr="10.0.0.1",
        ifname="eth1",
        port=29511,
    )
    path = GOLDEN / "check_probe_master.sh"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()
    assert "python=('/opt/py 3/bin/python')" in text
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_probe_script_reports_a_python_without_torch(tmp_path: Path) -> None:
    bare = tmp_path / "python-no-site"
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    done = subprocess.run(
        ["bash", "-c", render_probe(python=str(bare), is_master=False, ifname="nosuch0")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    values = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    assert "torch_version" not in values and "torch" in values["torch_error"]
    assert values["ifname_exists"] == "no"
    missing = subprocess.run(
        ["bash", "-c", render_probe(python="/nonexistent/python")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "python_error=" in missing.stdout


def test_json_of_a_node_report_is_plain_data() -> None:
    assert json.loads(json.dumps(node(0).to_dict()))["probe"]["ifname"] == "eth1"
