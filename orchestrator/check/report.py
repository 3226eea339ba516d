"""`orchestrator check`'s report: the text tables, the sections printed after each step,
and the JSON document of --json. Pure: no network, no files.
"""

from __future__ import annotations

from collections.abc import Sequence

import orchestrator.sizes as sizes
from orchestrator.check import measure
from orchestrator.check.facts import Master, NodeReport
from orchestrator.check.results import CaseRow, JobResult, Problem
from orchestrator.hosts.hostfile import Cluster
from orchestrator.nodes.paths.found import PathReport, matrix


def nodes_section(
    reports: Sequence[NodeReport],
    master: Master,
    problems: Sequence[Problem],
    backend: str,
    backend_reason: str,
) -> str:
    """After the nodes' facts: the node table, a blank line before it."""
    return (
        f"\nNODES (backend {backend}: {backend_reason})\n"
        f"{node_table(reports, master, problems, backend)}"
    )


MATRIX_UP_TO = 16  # nodes: beyond, the matrix is wider than a terminal


def paths_section(paths: PathReport) -> str:
    """After the node table: the paths proven, as a nodes x nodes matrix for small clusters."""
    failed = len(paths.failures)
    head = f"\nPATHS ({paths.tested()} TCP connection(s), {failed} failed)"
    if len(paths.nodes) > MATRIX_UP_TO:
        return head
    return f"{head}\n{matrix(paths)}"


def job_section(job: JobResult, backend: str, world_size: int, run_id: str) -> str:
    """After the collectives job: its table of cases, then the bandwidth sweep's."""
    if job.interrupted:
        lines = ["", f"COLLECTIVES: interrupted; run {run_id} was stopped on every node"]
    else:
        lines = ["", f"COLLECTIVES ({backend}, world size {world_size})"]
        lines.append(collectives_table(job.rows))
    if job.bandwidth:
        lines += [
            "",
            f"BANDWIDTH ({backend}, {world_size} ranks; time: mean of the timed "
            "iterations, averaged over ranks; algbw = size/time, busbw as nccl-tests)",
            bandwidth_table(job.bandwidth),
        ]
    return "\n".join(lines)


def result_section(
    job: JobResult,
    problems: Sequence[Problem],
    nodes: int,
    world_size: int,
    backend: str,
    elapsed: float,
) -> str:
    """The end of the report: the problems, if any, and the one-line result."""
    if job.interrupted:
        return f"\nRESULT: interrupted after {elapsed:.1f} s"
    if problems:
        return (
            f"\n{problems_text(problems)}\n"
            f"RESULT: FAILED ({len(problems)} problem(s)) in {elapsed:.1f} s"
        )
    return f"\nRESULT: passed ({nodes} node(s), {world_size} rank(s), {backend}) in {elapsed:.1f} s"


def json_document(
    cluster: Cluster,
    *,
    run_id: str,
    run_dir: str,
    reports: Sequence[NodeReport],
    master: Master,
    backend: str,
    backend_reason: str,
    job: JobResult,
    problems: Sequence[Problem],
    world_size: int,
    elapsed: float,
) -> dict:
    """The report as --json writes it."""
    return {
        "ok": not problems and not job.interrupted,
        "elapsed_s": round(elapsed, 3),
        "hostfile": cluster.path,
        "selection": cluster.selection or None,
        "run_id": run_id,
        "run_dir": run_dir,
        "job": job.state,
        "backend": backend,
        "backend_reason": backend_reason,
        "world_size": world_size,
        "master": {"host": master.host, "addr": master.addr, "port": master.port},
        "nodes": [r.to_dict() for r in reports],
        "collectives": [row.__dict__ for row in job.rows],
        "bandwidth": [row.to_dict() for row in job.bandwidth],
        "problems": [str(p) for p in problems],
    }


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
