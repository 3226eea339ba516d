"""The error hierarchy: every foreseeable failure is one of these, written for a user.

The CLI catches `OrchestratorError` once, prints its message (no traceback) and exits
with its `exit_code`: 2 for bad input or configuration, 1 for a runtime failure, the
failing rank's code for a failed job, 130/143 after Ctrl-C / SIGTERM.
"""

from __future__ import annotations

from orchestrator.hostlist import compress_hosts


class OrchestratorError(Exception):
    """Root of all errors a user may see. `str()` says what, where, and what to do."""

    exit_code = 1


class ConfigError(OrchestratorError):
    """Bad input: a flag, a hostfile, an env file, a script path. Exit code 2."""

    exit_code = 2


class SourceError(ConfigError):
    """Bad input at a known place in a file: the message starts with `path:line:`."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        self.path = path
        self.line = line
        self.message = message
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")


class NodeError(OrchestratorError):
    """A node could not be used (unreachable, refused, no torch, busy port...).

    Configuration problems (unknown host key, wrong user, missing interface) use exit
    code 2; runtime problems (timeouts, lost connections) use 1.
    """

    def __init__(self, host: str, message: str, *, exit_code: int = 1) -> None:
        self.host = host
        self.message = message
        self.exit_code = exit_code
        super().__init__(f"{host}: {message}")


class NodeErrors(OrchestratorError):
    """Nodes failed in one parallel step; carries every node's error.

    One failed node reads as its own one-line message; several are grouped under a
    heading naming the step, nodes that failed alike on one line (`ceon[1-212] (212
    nodes): jump host login: ...`), so that 200 nodes behind one cause read as one.
    """

    def __init__(self, errors: list[NodeError], what: str) -> None:
        self.errors = errors
        self.what = what
        self.exit_code = max(e.exit_code for e in errors)
        if len(errors) == 1:
            super().__init__(str(errors[0]))
            return
        alike: dict[str, list[str]] = {}
        for error in errors:
            alike.setdefault(error.message, []).append(error.host)
        lines = [f"{what} failed on {len(errors)} node(s):"]
        for message, hosts in alike.items():
            many = f" ({len(hosts)} nodes)" if len(hosts) > 1 else ""
            lines.append(f"  {compress_hosts(hosts)}{many}: {message}")
        super().__init__("\n".join(lines))


class Interrupted(OrchestratorError):
    """Ctrl-C or SIGTERM before the job ran; whatever had started was stopped."""

    def __init__(self, signum: int, during: str) -> None:
        import signal

        self.signum = signum
        self.during = during
        self.exit_code = 128 + signum
        super().__init__(
            f"{signal.Signals(signum).name} during {during}; stopped on every "
            "node, nothing was left running"
        )


class RunNotReachable(OrchestratorError):
    """A run that cannot be asked anything now: its controller, the way to its nodes, is
    gone. A runtime condition, exit code 1."""


class RunFailed(OrchestratorError):
    """A run that did not succeed (the Python API's `RunOutcome.check()`): `outcome` says
    how it ended, and which rank failed first, on which host."""

    def __init__(self, outcome) -> None:
        self.outcome = outcome
        self.exit_code = outcome.exit_code or 1
        failure = outcome.failure
        where = f": rank {failure.rank} on {failure.host} first" if failure else ""
        super().__init__(
            f"run {outcome.run_id} {outcome.state} (exit code {outcome.exit_code}){where}"
        )


# --- errors across a process boundary ------------------------------------------------------
# A detached controller (start/detach.py) reports why its start failed as one JSON object;
# the caller raises the same type from it (api/launching.py's started_error).


def error_report(error: OrchestratorError) -> dict:
    """The JSON-able report of `error`: its message, exit code, type, and what rebuilds it."""
    report: dict = {"error": str(error), "exit_code": error.exit_code}
    if isinstance(error, NodeErrors):
        nodes = [_node_fields(e) for e in error.errors]
        return {**report, "error_type": "NodeErrors", "what": error.what, "nodes": nodes}
    if isinstance(error, NodeError):
        return {**report, "error_type": "NodeError", **_node_fields(error)}
    if isinstance(error, Interrupted):
        signal = {"signum": error.signum, "during": error.during}
        return {**report, "error_type": "Interrupted", **signal}
    if isinstance(error, SourceError):
        where = {"path": error.path, "line": error.line, "message": error.message}
        return {**report, "error_type": "SourceError", **where}
    for kind in (ConfigError, RunNotReachable):
        if isinstance(error, kind):
            return {**report, "error_type": kind.__name__}
    return {**report, "error_type": "OrchestratorError"}


def error_from_report(report: dict) -> OrchestratorError:
    """The error `error_report` described, of the same type, message and exit code. A
    report without a type (a controller that ended before it could say) is typed by its
    exit code: 2 is bad input."""
    message, code = str(report["error"]), int(report.get("exit_code") or 1)
    kind = report.get("error_type") or ("ConfigError" if code == 2 else "OrchestratorError")
    try:
        error = _REBUILD[kind](report, message)
    except (KeyError, TypeError, ValueError):  # a type or fields this version does not know
        error = OrchestratorError(message)
    error.args = (message,)  # word for word what the controller said
    error.exit_code = code
    return error


def _node_fields(error: NodeError) -> dict:
    return {"host": error.host, "message": error.message, "exit_code": error.exit_code}


def _node_error(fields: dict) -> NodeError:
    return NodeError(fields["host"], fields["message"], exit_code=int(fields["exit_code"]))


# error type -> (report, message) -> the error
_REBUILD = {
    "OrchestratorError": lambda r, message: OrchestratorError(message),
    "ConfigError": lambda r, message: ConfigError(message),
    "RunNotReachable": lambda r, message: RunNotReachable(message),
    "SourceError": lambda r, message: SourceError(r["path"], r["line"], r["message"]),
    "NodeError": lambda r, message: _node_error(r),
    "NodeErrors": lambda r, message: NodeErrors([_node_error(n) for n in r["nodes"]], r["what"]),
    "Interrupted": lambda r, message: Interrupted(int(r["signum"]), r["during"]),
}
