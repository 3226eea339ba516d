"""Reading a rank's stacks from outside, with py-spy (see orchestrator.agent.stacks).

`py-spy dump --pid PID --json` reads the interpreter's memory through ptrace: nothing is
needed in the rank. Standard library only: this module runs on the nodes too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time


class StackError(Exception):
    """Why one way of taking a stack did not work, in words for the user."""


def find_py_spy() -> str | None:
    """py-spy of the job's environment (beside the node's interpreter), else on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(beside, os.X_OK):
        return beside
    import shutil  # here: only a stack request needs it

    return shutil.which("py-spy")


def dump_with_py_spy(py_spy: str, pid: int, timeout: float) -> tuple[list[dict], float]:
    """(threads, seconds the call took) from `py-spy dump --pid PID --json`."""
    import json  # here: only a stack request needs it, not every agent's start

    argv = [py_spy, "dump", "--pid", str(pid), "--json"]
    env = dict(os.environ, RUST_BACKTRACE="0")  # its error without a Rust backtrace
    start = time.monotonic()
    try:
        result = subprocess.run(argv, capture_output=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise StackError(f"no answer within {timeout:g} s") from None
    except OSError as error:
        raise StackError(f"cannot run {py_spy}: {error.strerror or error}") from None
    took = time.monotonic() - start
    if result.returncode != 0:
        raise StackError(py_spy_failure(result.stderr.decode(errors="replace")))
    try:
        threads = [py_spy_thread(entry, pid) for entry in json.loads(result.stdout)]
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise StackError(f"unreadable output ({error})") from None
    return threads, took


def py_spy_thread(entry: dict, pid: int) -> dict:
    """One thread of py-spy's JSON as a record's thread: the main one is that whose kernel
    thread id (`os_thread_id`) is the process's pid (by name where py-spy gives no such id;
    a program may rename its main thread)."""
    active, tid = entry.get("active"), entry.get("os_thread_id")
    name = entry.get("thread_name")
    return {
        "name": name,
        "id": entry.get("thread_id"),
        "main": tid == pid if tid is not None else name == "MainThread",
        "idle": None if active is None else not active,
        "frames": [
            {"function": f["name"], "file": f["filename"], "line": f.get("line")}
            for f in entry["frames"]
        ],
    }


def py_spy_failure(stderr: str) -> str:
    """py-spy's error in one line; a refused ptrace named as such, with the setting."""
    if "Permission Denied" in stderr or "Operation not permitted" in stderr:
        try:
            with open("/proc/sys/kernel/yama/ptrace_scope") as handle:
                scope = f"kernel.yama.ptrace_scope={handle.read().strip()}"
        except OSError:
            scope = "kernel.yama.ptrace_scope"
        return f"Permission denied (ptrace not allowed: {scope}, or no CAP_SYS_PTRACE)"
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    first = next((line for line in lines if line.startswith("Error:")), lines[0] if lines else "")
    why = first.removeprefix("Error:").strip() or "failed"
    causes = [line for line in lines if line[:1].isdigit() and ": " in line]
    if causes:  # anyhow's "Caused by:" list: "0: No such file or directory (os error 2)"
        why += f" ({causes[0].partition(': ')[2]})"
    return why
