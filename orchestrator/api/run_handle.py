"""A run, as a Python program holds it: `Run` (its state, its lines, wait, stop) and `attach`.

A `Run` reads the run record (runs/<run-id>/: status.json, logs/) that the run's controller
writes, so it works the same for a run launched from this process, from another shell or
machine sharing the folder, detached or ended, SSH, local or SLURM; it holds no thread,
no connection and no signal handler, and prints nothing.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from orchestrator.api.rank_stacks import take_stacks
from orchestrator.api.registry import recorded_backend
from orchestrator.api.stop import stop_run
from orchestrator.console.reading import (
    NodeReports,
    fold_lines,
    follow,
    last_lines_of,
    line_filter,
)
from orchestrator.errors import ConfigError, RunFailed
from orchestrator.nodes.refill import fetch_incomplete
from orchestrator.options.backend_facts import facts_of
from orchestrator.options.running import DEFAULT_RUN_DIR
from orchestrator.record.runs import RunRecord, controller_alive, list_runs, run_status
from orchestrator.record.states import RankPhase, RunState, RunStatus

LAST_LINES = 20  # of the failing rank, in a Failure
POLL_S = 0.2
SLURM_POLL_S = 5.0  # how often `wait` asks SLURM about a job no controller follows


@dataclass(frozen=True)
class Failure:
    """The rank that failed first: where, with what, and what it printed last."""

    rank: int
    host: str
    exit_code: int | None
    last_lines: tuple[str, ...]


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended: its state (succeeded, failed, stopped, hung, unreachable, lost), the
    exit code the command line would give, the summary it printed, and the first failing
    rank."""

    run_id: str
    state: RunState
    exit_code: int
    summary: str
    failure: Failure | None

    @property
    def ok(self) -> bool:
        return self.state == RunState.SUCCEEDED

    def check(self) -> RunOutcome:
        """This outcome, or RunFailed where the run did not succeed."""
        if not self.ok:
            raise RunFailed(self)
        return self


class Run:
    """A launched run, by its record. See the module docstring."""

    def __init__(self, run_id: str, run_dir: str | Path = DEFAULT_RUN_DIR) -> None:
        self.record = RunRecord.open(run_dir, run_id)  # ConfigError where there is none
        self.run_id = run_id
        self.run_dir = Path(run_dir)

    def __repr__(self) -> str:
        return f"Run({self.run_id!r}, run_dir={str(self.run_dir)!r})"

    def status(self) -> RunStatus:
        """The run's status as it is now: its state (record/states.py's rule), exit code,
        summary, ...; `.document` is status.json itself (nodes, ranks, metrics, ...), a
        SLURM run not yet ended with squeue's or sacct's word on its job."""
        current = self.record.run_status()
        return recorded_backend(current.backend).poll(self.record, current)

    def stacks(self, method: str = "auto") -> dict:
        """Every rank's Python stack, taken now, folded (see `orchestrator stacks`): the
        answer as `stacks --json` prints it."""
        return take_stacks(self.record, method)

    @property
    def state(self) -> RunState | None:
        """The state now; None only where the record names none we know."""
        return self.status().state

    def done(self) -> bool:
        current = self.record.run_status()
        if current.asks_slurm:  # no controller follows the job: SLURM knows its end
            current = self.status()
        return current.ended

    def wait(self, timeout: float | None = None) -> RunOutcome:
        """Block until the run ends (TimeoutError after `timeout` seconds); how it ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        slurm_asked = None
        while True:
            current = self.record.run_status()  # the controller keeps it current
            if current.asks_slurm and (
                slurm_asked is None or time.monotonic() - slurm_asked >= SLURM_POLL_S
            ):
                slurm_asked = time.monotonic()
                current = self.status()
            if current.ended:
                return self.outcome(current)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"run {self.run_id} still {current.document.get('state')} after {timeout:g} s"
                )
            time.sleep(POLL_S)

    def outcome(self, status: RunStatus) -> RunOutcome:
        """How an ended run ended (`status.ended`)."""
        code = status.exit_code
        if code is None:
            code = 0 if status.state == RunState.SUCCEEDED else 1
        return RunOutcome(
            self.run_id, status.state, code, status.summary, self.failure(status.document)
        )

    def failure(self, status: Mapping) -> Failure | None:
        """The first rank to fail (by when it ended), with its last lines."""
        failed = [r for r in status.get("ranks") or [] if r.get("state") == RankPhase.FAILED]
        if not failed:
            return None
        first = min(failed, key=lambda r: (r.get("ended_at") or "~", r.get("rank", 0)))
        rank = int(first["rank"])
        path = self.record.logs_dir / f"rank-{rank}.log"
        lines = tuple(
            line.decode(errors="replace").rstrip("\n") for line in last_lines_of(path, LAST_LINES)
        )
        return Failure(rank, str(first.get("host")), first.get("exit_code"), lines)

    def logs(self, rank: int | None = None, follow: bool = False) -> Iterator[str]:
        """Every line of the run, each rank's attributed (`[host rN] text`, the
        controller's `[orchestrator] ...`; torchrun's own reports left out), or one rank's
        (its own text); with `follow`, new ones as they come until the run ends."""
        return log_lines(self.record, rank, follow)

    def stop(self, wait: float = 60.0) -> RunOutcome:
        """Stop the run on every node (as Ctrl-C would) and wait for its end."""
        stop_run(self.record, wait, say=lambda text: None)  # its words are the CLI's
        return self.wait(timeout=wait)

    def fetch_incomplete(self, say: Callable[[str], None] = lambda text: None) -> int:
        """Complete the rank files the record lists as incomplete (its disk was full) from
        the nodes' copies; 0 when every one is whole."""
        return fetch_incomplete(self.record, say)


def attach(run_id: str, run_dir: str | Path = DEFAULT_RUN_DIR, take_over: bool = True) -> Run:
    """The run `run_id` of `run_dir`, running, detached or ended.

    A SLURM run whose controller is gone (its job goes on: it is SLURM's) gets a new one
    first, in the background, as `orchestrator attach RUN --detach` starts it (unless
    `take_over` is False): its logs go on where they stopped, and stacks, hang checks and
    resubmissions work again. ConfigError where it cannot be taken over (its record says
    why)."""
    run = Run(run_id, run_dir)
    if take_over and needs_controller(run.record):
        from orchestrator.api.taking_over import take_over_detached

        take_over_detached(run_id, run_dir)
    return run


def needs_controller(record: RunRecord) -> bool:
    """A SLURM run that has not ended, whose controller is gone, and which it left ready
    for another (a run of an older orchestrator is not)."""
    from orchestrator.slurm.following.handover import STATE_FILE

    status = record.read_status()
    return (
        facts_of(status.get("backend")).scheduled
        and (record.path / STATE_FILE).exists()
        and not run_status(status).ended_in_record
        and not controller_alive(status)
    )


def log_lines(
    record: RunRecord,
    rank: int | None = None,
    following: bool = False,
    tail: int | None = None,
    torchrun_reports: bool = False,
) -> Iterator[str]:
    """What `logs` shows (see Run.logs); `tail`: only the last lines, then any that follow;
    `torchrun_reports`: keep torchrun's own failure and shutdown reports too."""
    for line in log_bytes(record, rank, following, tail, torchrun_reports):
        if line:
            yield line.decode(errors="replace").rstrip("\n")


def log_bytes(
    record: RunRecord,
    rank: int | None,
    following: bool,
    tail: int | None = None,
    torchrun_reports: bool = False,
    grep: str | None = None,
    node: str | None = None,
    fold: bool = False,
) -> Iterator[bytes]:
    """The lines of `log_lines` as bytes, with b"" whenever none came for a moment while
    following (a caller may flush then): only those matching `grep` (a regular expression)
    and about `node`; with `fold`, lines alike from several ranks shown once, as on the
    console (`logs` of the command line)."""
    if grep is not None:
        try:
            re.compile(grep)
        except re.error as exc:
            raise ConfigError(f"--grep {grep!r} is not a valid regular expression: {exc}") from None
    keep = line_filter(grep, node)
    chosen = keep if grep or node else None
    lines = (
        line
        for line in raw_lines(record, rank, following, tail, torchrun_reports, chosen)
        if not line or keep(line)
    )
    if fold and rank is None:
        return fold_lines(lines, time.monotonic if following else None)
    return lines


def raw_lines(
    record: RunRecord,
    rank: int | None,
    following: bool,
    tail: int | None,
    torchrun_reports: bool,
    keep,
) -> Iterator[bytes]:
    """The log's lines, torchrun's reports left out unless asked; `keep` filters the tail."""
    status = record.read_status()
    if rank is not None:
        world = int(status.get("world_size") or 0)
        if not 0 <= rank < world:
            raise ConfigError(f"--rank {rank}: run {record.run_id} has ranks 0-{world - 1}")
        path = record.logs_dir / f"rank-{rank}.log"
    else:
        path = record.logs_dir / "combined.log"

    def done() -> bool:  # nobody writes the log any more
        return not record.run_status().being_written

    reports = NodeReports() if rank is None and not torchrun_reports else None
    if tail is not None:
        end = path.stat().st_size if path.exists() else 0  # the tail, then follow from here
        if reports is None:
            head = last_lines_of(path, tail, end=end, keep=keep)
        else:
            head = reports.tail(path, tail, end, keep)
        rest = follow(path, done, offset=end, idle=True) if following else iter(())
    else:
        head, rest = [], follow(path, done if following else (lambda: True), idle=True)
    if reports is not None:
        rest = reports.lines(rest)
    return itertools.chain(head, rest)


def runs_in(run_dir: str | Path = DEFAULT_RUN_DIR) -> list[tuple[str, dict]]:
    """(run id, status) of every run in `run_dir`, oldest first (`orchestrator runs`)."""
    return list_runs(run_dir)
