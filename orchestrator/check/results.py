"""`orchestrator check`: what it found. Problems that say what to fix, and what the
collectives job reported, read into a row per case and rank 0's bandwidth rows. Pure: no
network, no files (the nodes' problems are found by diagnose.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.check import measure
from orchestrator.record.states import RunState

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


@dataclass(frozen=True)
class CaseRow:
    op: str
    case: str
    expected: str
    result: str
    ok: bool


@dataclass
class JobResult:
    """What the collectives job left: rows per case, rank 0's bandwidth rows, problems."""

    state: RunState | str = "not run"
    exit_code: int = 0
    rows: list[CaseRow] = field(default_factory=list)
    bandwidth: list[measure.BandwidthRow] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def interrupted(self) -> bool:
        return self.state == RunState.STOPPED and self.exit_code >= 128


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


def _ranges(ranks: Sequence[int]) -> str:
    parts, start = [], None
    for i, rank in enumerate(ranks):
        if start is None:
            start = rank
        if i + 1 == len(ranks) or ranks[i + 1] != rank + 1:
            parts.append(str(start) if start == rank else f"{start}-{rank}")
            start = None
    return ", ".join(parts)
