"""`orchestrator check`: what the nodes and the collectives job reported -> problems that say
what to fix, tables, and the JSON document. Pure: no network, no files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.check import measure
from orchestrator.check.facts import Master, NodeReport

MIN_FREE_DISK = 1 << 30
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


# --- node problems ---------------------------------------------------------------------


def node_problems(nodes: Sequence[NodeReport], master: Master, backend: str) -> list[Problem]:
    """Everything wrong with the nodes, each with what to do about it."""
    problems: list[Problem] = []
    for node in nodes:
        problems += _one_node(node, master, backend)
    problems += _mismatches(nodes, backend)
    problems += _reach_problems(nodes, master)
    return problems


def _one_node(node: NodeReport, master: Master, backend: str) -> list[Problem]:
    host = node.host
    if not node.connected:
        return [Problem(host, f"unreachable over SSH: {node.ssh_error}", column="SSH")]
    if node.probe_error is not None:
        return [Problem(host, f"the probe failed: {node.probe_error}", column="SSH")]
    if "python_error" in node.probe or "python_version" not in node.probe:
        return [
            Problem(
                host,
                f"cannot run python {node.python!r}: "
                f"{node.get('python_error') or 'no answer'}; pass --python PATH or set "
                "python= for this node in the hostfile",
                column="PYTHON",
            )
        ]
    found: list[Problem] = []
    if "torch_version" not in node.probe:
        found.append(
            Problem(
                host,
                f"torch is not installed for {node.python} (python "
                f"{node.get('python_version')}: {node.get('torch_error') or '?'}); "
                "install it there, or point --python (or the hostfile's python=) "
                "at an interpreter that has it",
                column="TORCH",
            )
        )
    elif node.get(backend) != "yes":
        found.append(
            Problem(
                host,
                f"torch {node.get('torch_version')} here has no "
                f"{backend} backend; install a torch build with it"
                + (" or use --backend gloo" if backend == "nccl" else ""),
                column="TORCH",
            )
        )
    elif backend == "nccl" and node.gpu_shortfall:
        found.append(
            Problem(
                host,
                f"{node.gpu_shortfall}: NCCL needs one GPU per rank; {node.gpu_fix}",
                column="CUDA/SLOTS",
            )
        )
    ifname = node.get("ifname")
    if node.get("ifname_exists") == "no":
        found.append(
            Problem(
                host,
                f"network interface {ifname!r} does not exist here; check "
                "--ifname / the hostfile's ifname= (`ip -br link` lists them)",
                column="IFNAME",
            )
        )
    elif ifname and not node.source:
        found.append(
            Problem(
                host,
                f"interface {ifname} has no IPv4 address for NCCL/gloo to "
                "bind; choose another with --ifname",
                column="IFNAME",
            )
        )
    if node.index == 0 and node.get("port_free") == "no":
        found.append(
            Problem(
                host,
                f"MASTER_PORT {node.get('port')} is already in use on the "
                "master; pick another --master-port, or --master-port auto",
                column="MASTER",
            )
        )
    free = node.disk_free
    if free is not None and free < MIN_FREE_DISK:
        found.append(
            Problem(
                host,
                f"only {human_bytes(free)} free in {node.get('disk_path')}, "
                f"where runs keep their files; free at least "
                f"{human_bytes(MIN_FREE_DISK)}",
                blocks_job=False,
                column="DISK FREE",
            )
        )
    return found


def _mismatches(nodes: Sequence[NodeReport], backend: str) -> list[Problem]:
    usable = [n for n in nodes if n.usable and "torch_version" in n.probe]
    found = []

    def differs(key: str, what: str, fix: str, column: str, shorten=lambda v: v) -> None:
        values = {n.host: shorten(n.get(key)) for n in usable if n.get(key)}
        if len(set(values.values())) > 1:
            listing = ", ".join(f"{h} {v}" for h, v in values.items())
            found.append(
                Problem(
                    "cluster",
                    f"{what} differ between nodes ({listing}); {fix}",
                    blocks_job=False,
                    column=column,
                )
            )

    differs("torch_version", "torch versions", "install the same torch on every node", "TORCH")
    differs(
        "python_version",
        "python versions",
        "use the same python on every node",
        "PYTHON",
        lambda v: ".".join(v.split(".")[:2]),
    )
    if backend == "nccl":
        differs("nccl_version", "NCCL versions", "install the same torch/NCCL everywhere", "NCCL")
    with_gpus = [n.host for n in usable if n.cuda_devices]
    if with_gpus and len(with_gpus) < len(usable):
        without = ", ".join(n.host for n in usable if not n.cuda_devices)
        found.append(
            Problem(
                "cluster",
                f"{without} see no CUDA device while "
                f"{', '.join(with_gpus)} do; the check falls back to gloo. Fix the "
                "drivers or the CUDA torch build there",
                blocks_job=False,
                column="CUDA/SLOTS",
            )
        )
    return found


def _reach_problems(nodes: Sequence[NodeReport], master: Master) -> list[Problem]:
    """Nodes that cannot open a TCP connection to MASTER_ADDR:MASTER_PORT, diagnosed."""
    failed = [n for n in nodes if n.reach.get("reach") == "error"]
    master_node = nodes[0] if nodes else None
    found = []
    if master_node is not None and master_node.reach.get("listen_error"):
        found.append(
            Problem(
                master.host,
                f"cannot listen on MASTER_PORT {master.port}: "
                f"{master_node.reach['listen_error']}; pick another --master-port",
                column="MASTER",
            )
        )
        return found
    # Every other node reaches the master's sshd but not the port: the port is blocked there.
    port_only = [n for n in failed if n.index != 0 and n.reach.get("sshd_port") == "ok"]
    tested = [n for n in nodes if n.reach.get("reach") and n.index != 0]
    if len(port_only) >= 2 and len(port_only) == len(tested):
        names = ", ".join(n.host for n in port_only)
        error = port_only[0].reach.get("reach_error", "")
        found.append(
            Problem(
                master.host,
                f"TCP port {master.port} on {master.addr} is not "
                f"reachable from {names} ({error}) although its sshd port "
                f"{master.sshd_port} is: a firewall blocks port {master.port}. "
                f"Open TCP port {master.port} on {master.host}, or pick an open "
                "one with --master-port",
                column="MASTER",
            )
        )
        failed = [n for n in failed if n not in port_only]
    for node in failed:
        ifname = node.get("ifname")
        via = (
            f"from {ifname} ({node.source})"
            if ifname and node.source
            else "(no interface routes there)"
            if not ifname
            else f"from {ifname}"
        )
        error = node.reach.get("reach_error", "?")
        if node.reach.get("sshd_port") == "ok":
            fix = (
                f"the master's sshd port {master.sshd_port} answers, so port "
                f"{master.port} is blocked on the way: open TCP port {master.port} on "
                f"{master.host} to this node, or pick another --master-port"
            )
        else:
            fix = (
                "set --ifname (or ifname= in the hostfile) to an interface that routes to "
                f"{master.addr}, or fix the route/firewall between them"
            )
        found.append(
            Problem(
                node.host, f"cannot reach {master.endpoint} {via}: {error}; {fix}", column="MASTER"
            )
        )
    return found


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


def human_bytes(size: float) -> str:
    for unit in ("B", "K", "M", "G", "T"):
        if size < 1024 or unit == "T":
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return f"{size:.1f}T"


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
                human_bytes(node.disk_free) if node.disk_free is not None else "-",
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
            measure.format_size(r.size) if r.size % 1024 == 0 else str(r.size),
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
