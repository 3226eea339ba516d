"""`orchestrator check`: what the collectives job reported -> problems that say what to fix,
and the text tables (the nodes' problems are found by diagnose.py). Pure: no network, no files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import orchestrator.sizes as sizes
from orchestrator.check import measure
from orchestrator.check.facts import Master, NodeReport

CASES = tuple((op, case) for op in measure.OPS for case in ("scalar", "vector")) + (
    ("barrier", ""),
)


@dataclass(frozen=True)
class Problem:
    """One thing to fix. `blocks_job`: the collectives job cannot run until it is fixed."""

    where: str  # a host, "rank 3 (host)", or "cluster"
    text: str
    blocks_job: bool = True
    column: str = ""  # the node table column to flag with "!"

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


# --- the collectives job ---------------------------------------------------------------


@dataclass(frozen=True)
class CaseRow:
    op: str
    case: str
    expected: str
    result: str
    ok: bool


def collective_results(
    records: Mapping[int, Sequence[dict]], world_size: int, host_of_rank: Mapping[int, str]
) -> tuple[list[CaseRow], list[Problem]]:
    """Per case: did every rank report the exact values? Problems name the rank and op."""
    rows, problems = [], []

    def who(rank: int) -> str:
        return f"rank {rank} ({host_of_rank.get(rank, '?')})"

    for rank in range(world_size):
        for record in records.get(rank, ()):
            if record.get("kind") == "error":
                problems.append(
                    Problem(
                        who(rank), f"failed during {record.get('phase')}: {record.get('error')}"
                    )
                )
    for op, case in CASES:
        wrong, missing = [], []
        for rank in range(world_size):
            found = [
                r
                for r in records.get(rank, ())
                if r.get("kind") == "result" and r.get("op") == op and r.get("case") == case
            ]
            if not found:
                missing.append(rank)
                continue
            record = found[-1]
            reason = record.get("mismatch") or "reported a wrong result"
            if case == "scalar" and record.get("got") != measure.expected_scalar(
                op, rank, world_size
            ):
                reason = (
                    f"got {record.get('got')}, must be "
                    f"{measure.expected_scalar(op, rank, world_size)}"
                )
                record = {**record, "ok": False}
            if not record.get("ok"):
                wrong.append(rank)
                label = f"{op} ({case})" if case else op
                problems.append(Problem(who(rank), f"{label}: {reason}"))
        expected = (
            measure.describe_expected(op, case, world_size)
            if op != "barrier"
            else "completes on every rank"
        )
        if wrong:
            result = "WRONG on rank " + ", ".join(map(str, wrong))
        elif missing:
            result = "no result from rank " + _ranges(missing)
        else:
            result = f"ok on {world_size}/{world_size} ranks"
        rows.append(CaseRow(op, case, expected, result, not wrong and not missing))
    return rows, problems


def bandwidth_rows(records: Sequence[dict], world_size: int) -> list[measure.BandwidthRow]:
    """Rank 0's bandwidth records, as rows with nccl-tests' algbw and busbw."""
    rows = []
    for record in records:
        if record.get("kind") == "bandwidth" and record.get("seconds", 0) > 0:
            rows.append(
                measure.BandwidthRow(
                    op=record["op"],
                    size=int(record["size"]),
                    count=int(record["count"]),
                    seconds=float(record["seconds"]),
                    world_size=world_size,
                    warmup=int(record.get("warmup", 0)),
                    iters=int(record.get("iters", 0)),
                )
            )
    return rows


# --- text ------------------------------------------------------------------------------


def table(rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def node_table(
    nodes: Sequence[NodeReport], master: Master, problems: Sequence[Problem], backend: str
) -> str:
    flagged = {(p.where, p.column) for p in problems if p.column}
    cluster_flags = {p.column for p in problems if p.where == "cluster" and p.column}
    header = [
        "NODE",
        "SSH",
        "PYTHON",
        "TORCH",
        "NCCL",
        "CUDA/SLOTS",
        "IFNAME",
        f"TCP TO {master.endpoint}",
        "DISK FREE",
    ]
    rows = [header]
    for node in nodes:
        if not node.connected:
            cells = ["unreachable"] + ["-"] * 7
        else:
            rtt = (
                "local"
                if node.local
                else f"{node.ssh_rtt_ms:.1f} ms"
                if node.ssh_rtt_ms is not None
                else "ok"
            )
            ifname = node.get("ifname") or "(none)"
            cells = [
                rtt,
                node.get("python_version") or "-",
                node.get("torch_version") or "-",
                node.get("nccl_version") or "-",
                node.devices_cell,
                f"{ifname} {node.source}".strip(),
                _reach_cell(node),
                sizes.human_bytes(node.disk_free) if node.disk_free is not None else "-",
            ]
        row = [node.host]
        for column, cell in zip(header[1:], cells, strict=True):
            column = "MASTER" if column.startswith("TCP TO") else column
            mark = (node.host, column) in flagged or (column in cluster_flags and cell != "-")
            row.append(f"{cell} !" if mark else cell)
        rows.append(row)
    return table(rows)


def _reach_cell(node: NodeReport) -> str:
    if node.reach.get("reach") == "ok":
        return f"ok {float(node.reach.get('reach_ms', 0)):.1f} ms"
    if node.reach.get("reach") == "error":
        return "FAILED"
    return "not tested"


def collectives_table(rows: Sequence[CaseRow]) -> str:
    body = [["OP", "CASE", "EXPECTED", "RESULT"]]
    body += [[r.op, r.case, r.expected, r.result] for r in rows]
    return table(body)


def bandwidth_table(rows: Sequence[measure.BandwidthRow]) -> str:
    body = [["OP", "SIZE", "COUNT", "ITERS", "TIME(us)", "ALGBW(GB/s)", "BUSBW(GB/s)"]]
    body += [
        [
            r.op,
            sizes.format_size(r.size) if r.size % 1024 == 0 else str(r.size),
            str(r.count),
            str(r.iters),
            f"{r.seconds * 1e6:.1f}",
            f"{r.algbw:.3f}",
            f"{r.busbw:.3f}",
        ]
        for r in rows
    ]
    return table(body, right=(1, 2, 3, 4, 5, 6))


def problems_text(problems: Sequence[Problem]) -> str:
    lines = [f"PROBLEMS ({len(problems)}):"]
    lines += [f"  - {p}" for p in problems]
    return "\n".join(lines)


def _ranges(ranks: Sequence[int]) -> str:
    parts, start = [], None
    for i, rank in enumerate(ranks):
        if start is None:
            start = rank
        if i + 1 == len(ranks) or ranks[i + 1] != rank + 1:
            parts.append(str(start) if start == rank else f"{start}-{rank}")
            start = None
    return ", ".join(parts)
