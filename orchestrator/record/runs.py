"""The run record: runs/<run-id>/ with plan.yaml, the node scripts, logs/, status.json and
metrics.jsonl.

status.json is the one place a run's state lives; it is written atomically (temp file +
rename), so `status`, `logs -f` and `runs` in another shell always read a whole document,
and a write that fails (no space left) leaves the previous one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from orchestrator.errors import ConfigError
from orchestrator.record.states import RunState, RunStatus

RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def now_iso(when: float | None = None) -> str:
    stamp = datetime.fromtimestamp(time.time() if when is None else when, tz=timezone.utc)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_status(
    run_id: str,
    backend: str,
    command: str,
    program: str,
    nnodes: int,
    world_size: int,
    master: str,
) -> dict:
    """status.json as a run starts: what it runs, where, and which controller watches it."""
    return {
        "run_id": run_id,
        "backend": backend,
        "state": RunState.STARTING,
        "command": command,
        "program": program,
        "nnodes": nnodes,
        "world_size": world_size,
        "master": master,
        "started_at": now_iso(),
        "ended_at": None,
        "exit_code": None,
        "summary": None,
        "controller": this_controller(),
    }


def ended_status(state: RunState, exit_code: int, summary: str | None) -> dict:
    """status.json's last word on a run, whichever backend ran it: how it ended, its exit
    code, when, and why (None: nothing to say beyond the state)."""
    return {"state": state, "exit_code": exit_code, "ended_at": now_iso(), "summary": summary}


def controller_log(run_dir: str | Path, run_id: str) -> str:
    """Where a controller of its own (start/detach.py) writes what it prints: a hidden file
    beside the run's folder, so a start that fails before the record exists is kept too."""
    return os.path.join(run_dir, f".{run_id}.controller.log")


def this_controller() -> dict:
    """status.json's `controller`: this process, as `controller_alive` checks it."""
    pid = os.getpid()
    return {"pid": pid, "start_time": process_start_time(pid), "host": socket.gethostname()}


def new_run_id() -> str:
    """A sortable, unique-enough id: 20261122-153012-a3f9."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def check_run_id(run_id: str) -> str:
    if not RUN_ID.fullmatch(run_id):
        raise ConfigError(
            f"--run-id {run_id!r}: use letters, digits, '.', '-' and '_' "
            "(starting with a letter or digit, at most 100 characters)"
        )
    return run_id


def refuse_existing(run_dir: str | Path, run_id: str) -> None:
    """A new run's id must not name a run already in `run_dir`."""
    if (Path(run_dir) / run_id).exists():
        raise ConfigError(f"run {run_id!r} already exists in {run_dir}; choose another --run-id")


@dataclass(frozen=True)
class RunRecord:
    """The folder of one run on the controller."""

    path: Path

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def logs_dir(self) -> Path:
        return self.path / "logs"

    @property
    def status_path(self) -> Path:
        return self.path / "status.json"

    @property
    def metrics_path(self) -> Path:
        """The metrics channel's records (orchestrator.supervise.metrics)."""
        return self.path / "metrics.jsonl"

    @classmethod
    def create(cls, run_dir: str | Path, run_id: str) -> RunRecord:
        path = Path(run_dir) / check_run_id(run_id)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # e.g. --run-dir names a file
            raise ConfigError(
                f"cannot create the run folder {path}: {exc.strerror}; choose another --run-dir"
            ) from None
        try:
            path.mkdir()
        except FileExistsError:
            raise ConfigError(
                f"run {run_id!r} already exists in {path.parent}; choose "
                "another --run-id or remove that folder"
            ) from None
        except OSError as exc:
            raise ConfigError(
                f"cannot create the run folder {path}: {exc.strerror}; choose another --run-dir"
            ) from None
        (path / "logs").mkdir()
        return cls(path)

    @classmethod
    def open(cls, run_dir: str | Path, run_id: str) -> RunRecord:
        path = Path(run_dir) / run_id
        if not RUN_ID.fullmatch(run_id) or not (path / "status.json").exists():
            raise ConfigError(
                f"no run {run_id!r} in {run_dir}; `orchestrator runs "
                f"--run-dir {run_dir}` lists the runs there"
            )
        return cls(path)

    def run_status(self) -> RunStatus:
        """status.json as read now, its state as a reader sees it (record/states.py)."""
        return run_status(self.read_status())

    def read_status(self) -> dict:
        try:
            status = json.loads(self.status_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read {self.status_path}: {exc}") from None
        if not isinstance(status, dict):
            raise ConfigError(f"cannot read {self.status_path}: not a JSON object")
        return status

    def write_status(self, status: dict) -> OSError | None:
        """Replace status.json; the error when it could not be written (its file system is
        full, ...): the previous file then stays as it was, and nothing is raised, since a
        run must not end over its record."""
        if "goodput" not in status and status.get("ended_at"):
            status = {**status, **self.kept_goodput(status)}
        tmp = self.status_path.with_name(f".status.json.{os.getpid()}.tmp")
        text = json.dumps(status, indent=2) + "\n"
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, self.status_path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            return exc
        return None

    def kept_goodput(self, status: dict) -> dict:
        """The run's last word keeps the goodput its end wrote (record/goodput/kept.py):
        {"goodput": ...} where the run ended and status.json has one, else {}."""
        state = RunState.parse(status.get("state"))
        if state is None or not state.is_final:
            return {}
        try:
            kept = json.loads(self.status_path.read_text(encoding="utf-8")).get("goodput")
        except (OSError, ValueError, AttributeError):
            return {}
        return {"goodput": kept} if isinstance(kept, dict) else {}


def list_runs(run_dir: str | Path) -> list[tuple[str, dict]]:
    """(run id, status) of every run in run_dir, oldest first."""
    root = Path(run_dir)
    if not root.is_dir():
        return []
    found = []
    for path in sorted(root.iterdir()):
        status_path = path / "status.json"
        if status_path.is_file():
            try:
                status = json.loads(status_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(status, dict):
                found.append((path.name, status))
    found.sort(key=lambda item: item[1].get("started_at") or "")
    return found


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of a process (clock ticks since boot), to tell a live
    controller from a recycled pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    return int(stat[stat.rfind(b")") + 2 :].split()[19])


def controller_alive(status: dict) -> bool:
    """Is the controller process that owns this run still running?"""
    controller = status.get("controller") or {}
    pid, started = controller.get("pid"), controller.get("start_time")
    return bool(pid) and started is not None and process_start_time(pid) == started


def run_status(status: dict) -> RunStatus:
    """The typed view of a status.json document, its controller looked up now."""
    return RunStatus.of(status, controller_alive(status))
