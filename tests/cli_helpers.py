"""Running the real `orchestrator` CLI from tests, and looking at what a run left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ORCHESTRATOR = [sys.executable, "-m", "orchestrator"]


def run_cli(args: Sequence[str], *, cwd: Path | str | None = None,
            env: Mapping[str, str] | None = None, timeout: float = 240,
            ) -> subprocess.CompletedProcess[str]:
    """Run `orchestrator ARGS` to its end; returns the completed process (text)."""
    return subprocess.run([*ORCHESTRATOR, *args], cwd=cwd, env=dict(env or os.environ),
                          capture_output=True, text=True, timeout=timeout)


def start_cli(args: Sequence[str], *, cwd: Path | str | None = None,
              env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    """Start `orchestrator ARGS` in the background, output to pipes (text)."""
    return subprocess.Popen([*ORCHESTRATOR, *args], cwd=cwd, env=dict(env or os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_until(predicate: Callable[[], object], timeout: float, what: str,
               poll: float = 0.1) -> object:
    """Poll until `predicate()` is truthy; fail the test with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def wait_for_line(path: Path, text: str, timeout: float) -> None:
    wait_until(lambda: path.exists() and text in path.read_text(errors="replace"), timeout,
               f"{text!r} in {path}")


def run_pids(run_id: str) -> list[int]:
    """Pids on this machine (all lab nodes share its pid namespace) of a run's processes."""
    wanted = f"ORCHESTRATOR_RUN_ID={run_id}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes()
            stat = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        if stat[stat.rfind(b")") + 2:][:1] == b"Z":
            continue
        if wanted in environ.split(b"\0"):
            found.append(int(name))
    return found


def assert_nothing_left(run_id: str, within: float = 10.0) -> None:
    """Every process of the run is gone (giving them `within` seconds to go)."""
    try:
        wait_until(lambda: not run_pids(run_id), within, f"the processes of run {run_id} to end")
    except AssertionError:
        left = run_pids(run_id)
        details = []
        for pid in left:
            try:
                details.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                               .decode(errors="replace")[:200])
            except OSError:
                pass
        raise AssertionError(f"run {run_id} left processes running: {left} {details}") from None


def status_of(run_dir: Path, run_id: str) -> dict:
    return json.loads((run_dir / run_id / "status.json").read_text())
