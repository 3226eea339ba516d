"""A detached controller: the run goes on in a process of its own, the caller returns.

`launch --detach` and the Python API's `launch()` start the controller as a new process,
never by forking the caller: a fork of a threaded process (a Jupyter kernel, an asyncio
program) copies locks other threads held. The new process (`python -c START`) leaves the
caller's session, gets what to run through its stdin (a pickle: the function's dotted name
and its arguments, secrets among them, so never in a file or on a command line), runs it
exactly as in the foreground but without a console, and says on its stdout, once every node
has started (or why not), one JSON line: the report. Anything else it prints goes to
`log_path` (the traceback of a bug, say). `status`, `logs -f` and `stop` then work from
anywhere through the run record.

The function named is looked up by name (`module:function`), so that a stage above this
one (SLURM) can be run detached without this module importing it; it is called as
`function(*args, report)`.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import subprocess
import sys
import traceback
from collections.abc import Callable

from orchestrator.errors import OrchestratorError, error_report

Report = Callable[[dict], None]


def run_detached(target: str, args: tuple, log_path: str) -> dict:
    """Run `target(*args, report)` in a new, detached process; return its first report.

    The report is {"started": True, ...} once the job runs, or {"error": message,
    "exit_code": n, ...} when it could not start: an OrchestratorError's report names its
    type and what rebuilds it (errors.error_report).
    """
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    with open(log_path, "ab") as log:
        child = subprocess.Popen(
            [sys.executable, "-c", START, _package_root(), log_path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,  # Ctrl-C in the caller's terminal does not reach it
        )
    assert child.stdin is not None and child.stdout is not None
    try:
        child.stdin.write(pickle.dumps((target, args)))
        child.stdin.close()
    except BrokenPipeError:
        pass
    line = child.stdout.readline()
    child.stdout.close()
    if not line:
        return {
            "error": f"the detached controller ended before the job started; see {log_path}",
            "exit_code": 1,
        }
    return json.loads(line)


# The new process finds this package where the caller found it, whatever its sys.path was,
# without a PYTHONPATH that the ranks of a local run (which inherit the environment) would get.
START = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); "
    "from orchestrator.start.detach import main; sys.exit(main(sys.argv[1]))"
)


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(log_path: str) -> int:
    """The detached controller: read what to run, report once, run it to its end."""
    target, args = pickle.loads(sys.stdin.buffer.read())
    report_fd = os.dup(1)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    pipe = os.fdopen(report_fd, "wb")
    reported = False

    def report(message: dict) -> None:
        nonlocal reported
        if not reported:
            reported = True
            try:
                pipe.write(json.dumps(message).encode() + b"\n")
                pipe.close()
            except OSError:
                pass

    code = 1
    try:
        module, _, name = target.partition(":")
        work = getattr(importlib.import_module(module), name)
        code = work(*args, report)
        report({"error": "the run ended before all nodes started", "exit_code": code})
    except OrchestratorError as exc:
        report(error_report(exc))
        code = exc.exit_code
    except BaseException:  # a bug: keep the traceback where the user can find it
        traceback.print_exc()
        report({"error": f"the detached controller failed; see {log_path}", "exit_code": 1})
    return code
