"""What every node backend provides: a connection that can start the node agent."""

from __future__ import annotations

import select
from dataclasses import dataclass
from typing import Protocol

DEFAULT_CONNECT_TIMEOUT_S = 10.0
# How a remote node says the interpreter meant to run its agent is not there.
MISSING_PYTHON_WORDS = "not found on this node"


class AgentChannel(Protocol):
    """A running node agent: bytes to its stdin, bytes from its stdout."""

    def write(self, data: bytes) -> None:
        """Send bytes to the agent; a dead agent is not an error (its EOF will say so)."""

    def ready(self) -> bool:
        """Whether a short write would go through now without blocking."""

    def read(self, size: int) -> bytes:
        """Block for up to `size` bytes of agent output; b"" once it has ended."""

    def errors(self) -> str:
        """What the agent printed to stderr (read after its output ended)."""

    def close(self) -> None:
        """Release the channel once the agent's output has ended (closing it earlier
        makes the agent stop its node's processes)."""


@dataclass(frozen=True)
class IdleAgent:
    """An agent that finished a step and waits for the next one of the same run (see
    orchestrator.agent): kept on its connection by orchestrator.backends.sessions, closed
    with it."""

    python: str
    tag: str
    channel: AgentChannel
    since: float  # time.monotonic() when it became idle


class NodeLink(Protocol):
    """What a node agent's session needs of the node it runs on: its name, whether the node
    answers, and where its agent is kept between steps. A connection (below) is one; under
    SLURM a node of the allocation is one too (SLURM watches the node itself)."""

    host: str  # the name the hostfile uses
    idle_agent: IdleAgent | None  # closed by close()

    def answers(self) -> bool:
        """Whether the node itself answers (an SSH keepalive to its sshd), whatever its
        agent is doing; blocks until it does (True) or the connection is gone (False)."""

    def acknowledged(self, within: float) -> bool | None:
        """Whether the node's kernel acknowledged what was sent to it lately (TCP, within
        `within` seconds): the machine is up and the link carries, even when its sshd is
        too starved to answer; None where that cannot be told (through a jump host or a
        ProxyCommand, whose acknowledgements are the hop's). Never blocks."""


class NodeConnection(NodeLink, Protocol):
    """An open connection to one node."""

    address: str  # the address the controller reached it at (127.0.0.1 for this machine)

    def start_agent(self, python: str, tag: str) -> AgentChannel:
        """Start `python -c BOOTSTRAP orchestrator-agent TAG` on the node, with
        ORCHESTRATOR_RUN_ID=TAG in its environment (TAG is the run id for a job)."""

    def put_tree(self, local_dir: str, remote_dir: str) -> int:
        """Copy a local directory to the node (`~/` is the node user's home)."""

    def close(self) -> None:
        """Release the connection."""


def writable(stream) -> bool:
    """Whether a file or socket has room for a short write now (poll, not select: a
    controller of many nodes holds descriptors past select's 1024)."""
    try:
        poller = select.poll()
        poller.register(stream, select.POLLOUT)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True  # closed or not pollable: the write itself says what happened
