"""`orchestrator stacks RUN`: every rank's stacks, taken now by the run's own node agents.

The request goes through the run record to the run's controller (attached or detached, SSH,
local or SLURM), which asks every node at once and writes the answer to runs/<run-id>/stacks/
(supervise/stack_rounds.py); here we wait for it and fold it for reading.
"""

from __future__ import annotations

import secrets
import time

from orchestrator.errors import ConfigError, OrchestratorError, RunNotReachable
from orchestrator.record.runs import RunRecord, controller_alive
from orchestrator.supervise.stack_groups import fold, render_groups
from orchestrator.supervise.stack_rounds import ROUND_TIMEOUT_S, answer_to, ask_for_stacks

# The controller looks for requests on every pass of its loop (2 s apart when quiet), and a
# round ends within ROUND_TIMEOUT_S.
ANSWER_WITHIN_S = ROUND_TIMEOUT_S + 8.0


def take_stacks(record: RunRecord, method: str = "auto", timeout: float = ANSWER_WITHIN_S) -> dict:
    """Ask the run's controller for every rank's stacks; stacks.json of the round that
    answered, with its folder. Raises ConfigError for a run that has ended,
    RunNotReachable when its controller is gone."""
    current = record.run_status()
    status = current.document
    where = record.path / "stacks"
    if current.ended_in_record:
        earlier = f"; stacks taken earlier are in {where}" if where.exists() else ""
        raise ConfigError(
            f"run {record.run_id} has ended ({current.recorded_state}): no rank to take{earlier}"
        )
    if not current.controller_alive:
        raise RunNotReachable(
            f"run {record.run_id}: its controller (pid {status['controller']['pid']}) is gone, "
            "and with it the way to the nodes"
        )
    request = secrets.token_hex(4)
    # whole seconds: a file system's mtime may be coarser than time.time()
    asked_at = float(int(time.time()))
    ask_for_stacks(record.path, request, method)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = answer_to(record.path, request, since=asked_at)
        if answer is not None:
            return answer
        if not controller_alive(record.read_status()):
            raise RunNotReachable(f"run {record.run_id}: the controller ended before answering")
        time.sleep(0.1)
    raise OrchestratorError(f"run {record.run_id}: no stacks came within {timeout:g} s")


def stack_lines(answer: dict, rank: int | None = None, node: str | None = None) -> list[str]:
    """The answer folded (the odd group first), for --rank/--node only their ranks, and a
    closing line: how many, how, the longest pause, where the record is."""
    records = [
        r
        for r in answer.get("ranks", [])
        if (rank is None or r.get("rank") == rank) and (node is None or r.get("host") == node)
    ]
    hosts = {r.get("rank"): r.get("host", "?") for r in answer.get("ranks", [])}
    lines = render_groups(fold(records, hosts))
    lines += [f"[{host}] no answer" for host in answer.get("no_answer", []) if node in (None, host)]
    pauses = [r["pause_s"] for r in records if r.get("pause_s") is not None]
    ways = sorted({r.get("method") or "none" for r in records})
    longest = f", each rank paused at most {max(pauses) * 1000:.0f} ms" if pauses else ""
    lines.append(
        f"stacks of {len(records)} rank(s) taken in {answer.get('seconds', 0):.2f} s by "
        f"{', '.join(ways) or 'none'}{longest}; all of them in {answer.get('folder')}"
    )
    return lines
