"""`launch --detach`: the controller goes on in the background, the command returns.

The launching process forks before it opens any connection (no threads yet), the child
leaves the terminal's session and runs the launch exactly as in the foreground, without a
console, and tells the parent through a pipe once every node has started (or why not).
`status`, `logs -f` and `stop` then work from any shell through the run record.
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable

from orchestrator.errors import OrchestratorError

Report = Callable[[dict], None]


def run_detached(work: Callable[[Report], int], log_path: str) -> dict:
    """Run `work(report)` in a detached child; return the first report it sends.

    The report is {"started": True, ...} once the job runs, or {"error": message,
    "exit_code": n} when it could not start. `log_path` receives anything the detached
    controller prints, such as the traceback of a bug.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the detached controller
        os.close(read_fd)
        _detach_child(work, write_fd, log_path)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        line = pipe.readline()
    if not line:
        return {
            "error": f"the detached controller ended before the job started; see {log_path}",
            "exit_code": 1,
        }
    return json.loads(line)


def _detach_child(work: Callable[[Report], int], write_fd: int, log_path: str) -> None:
    os.setsid()
    pipe = os.fdopen(write_fd, "wb")
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
        os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null_fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        code = work(report)
        report({"error": "the run ended before all nodes started", "exit_code": code})
    except OrchestratorError as exc:
        report({"error": str(exc), "exit_code": exc.exit_code})
        code = exc.exit_code
    except BaseException:  # a bug: keep the traceback where the user can find it
        traceback.print_exc()
        report({"error": f"the detached controller failed; see {log_path}", "exit_code": 1})
    finally:
        os._exit(code)
