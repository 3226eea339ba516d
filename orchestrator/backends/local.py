"""The local backend: the node is this machine, reached through a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess

from orchestrator.agent import agent_argv
from orchestrator.backends.base import IdleAgent, writable
from orchestrator.errors import NodeError

READ_BYTES = 1 << 16  # a pipe's whole buffer


class LocalChannel:
    def __init__(self, host: str, python: str, tag: str) -> None:
        try:
            # A session of its own: Ctrl-C in the terminal reaches the controller only,
            # which then stops the node through the agent, in order.
            self.proc = subprocess.Popen(
                agent_argv(python, tag),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                bufsize=0,
                env={**os.environ, "ORCHESTRATOR_RUN_ID": tag},
            )
        except OSError as exc:
            raise NodeError(
                host,
                f"cannot run python {python!r}: {exc.strerror}; "
                "pass --python PATH or set python in the hostfile",
                exit_code=2,
            ) from None

    def write(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
        except (OSError, ValueError):
            pass  # the agent has ended; its output's end tells the rest

    def ready(self) -> bool:
        return writable(self.proc.stdin)

    def read(self, size: int) -> bytes:
        return os.read(self.proc.stdout.fileno(), size)

    def fileno(self) -> int:
        """The agent's stdout, for the controller's one reader to wait on."""
        return self.proc.stdout.fileno()

    def read_waiting(self) -> bytes:
        """What the agent's stdout holds, once it is readable (b"": it ended)."""
        return os.read(self.proc.stdout.fileno(), READ_BYTES)

    def errors(self) -> str:
        try:
            return self.proc.stderr.read().decode(errors="replace")
        except (OSError, ValueError):
            return ""

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class LocalConnection:
    """This machine as a node."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.address = "127.0.0.1"
        self.idle_agent: IdleAgent | None = None

    def answers(self) -> bool:
        """This machine is there as long as the controller is."""
        return True

    def acknowledged(self, within: float) -> bool:
        return True

    def start_agent(self, python: str, tag: str) -> LocalChannel:
        return LocalChannel(self.host, python, tag)

    def put_tree(self, local_dir: str, remote_dir: str) -> int:
        """Copy a directory tree (for --sync); returns the number of files."""
        target = os.path.expanduser(remote_dir)
        shutil.copytree(local_dir, target, dirs_exist_ok=True)
        return sum(len(files) for _, _, files in os.walk(target))

    def close(self) -> None:
        if self.idle_agent is not None:
            self.idle_agent.channel.close()
            self.idle_agent = None
