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

        self.exit_code = 128 + signum
        super().__init__(
            f"{signal.Signals(signum).name} during {during}; stopped on every "
            "node, nothing was left running"
        )


class JobFailed(OrchestratorError):
    """The job ran and did not succeed; the message is the failure summary."""

    def __init__(self, message: str, exit_code: int) -> None:
        self.exit_code = exit_code
        super().__init__(message)


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
