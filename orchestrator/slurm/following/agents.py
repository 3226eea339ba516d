"""The launcher's way to a SLURM job's node agents: through SLURM itself.

Each node's agent (orchestrator.agent.keeper) listens on a Unix socket on its node. The
launcher reaches it with one `srun --overlap --jobid JOB --nodelist NODE --ntasks 1` per
node, a step of the job that shares its allocation and runs `relay.DIAL` there: SLURM
carries that step's stdin and stdout as an SSH channel carries an agent's, so the agent's
protocol runs over it unchanged, and a `NodeSession` reads its frames into `Event`s.

Why srun: it needs nothing the job does not already have (no port open on the login node
or the nodes, no file system shared with them), it is authenticated and placed by SLURM
(the node's own slurmd starts the step, as the user), and it works from wherever the user
can run srun. One step per node rather than one for the whole job, because srun gives each
task's stdin to one task and merges their stdout by lines, while the protocol's frames
carry payloads of any bytes; a step costs the launcher one srun process (a few MB).
"""

from __future__ import annotations

import os
import queue
import subprocess
import time
from collections.abc import Sequence

from orchestrator.agent.relay import DIAL, socket_path
from orchestrator.backends.base import IdleAgent, writable
from orchestrator.backends.sessions import Event, NodeSession
from orchestrator.errors import OrchestratorError
from orchestrator.slurm.control.client import SlurmCommands

DIAL_WAIT_S = 120.0  # how long the dial waits on the node for its agent's socket
CLOSE_WAIT_S = 5.0  # for srun to end once its stdin is closed


class KeeperDial:
    """What a dial's channel does whichever way it goes: the keeper's first line (`at
    OFFSET LOST`) is taken off the front of the stream, and says where the agent's bytes
    start and how many before them the keeper no longer had."""

    def __init__(self) -> None:
        self.head: bytes | None = b""  # the keeper's first line until it is whole, then None
        self.start = 0  # the stream's offset of the first byte read (the keeper's word)
        self.lost = 0  # bytes before `start` that the keeper no longer had

    # The rest of an agent's channel (backends/base.py's AgentChannel), each way's own.
    def raw(self, size: int) -> bytes:
        raise NotImplementedError

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def errors(self) -> str:
        raise NotImplementedError

    def close(self, wait: float = CLOSE_WAIT_S) -> None:
        raise NotImplementedError

    @property
    def connected(self) -> bool:
        """The keeper answered (a dial that ends before it could not reach it)."""
        return self.head is None

    def read(self, size: int) -> bytes:
        """The agent's bytes, after the keeper's first line."""
        while self.head is not None:
            chunk = self.raw(size)
            if not chunk:
                return b""
            line, newline, rest = (self.head + chunk).partition(b"\n")
            self.head = None if newline else self.head + chunk
            if newline:
                words = line.split()
                if len(words) == 3 and words[0] == b"at":
                    self.start, self.lost = int(words[1]), int(words[2])
            if rest:
                return rest
        return self.raw(size)


class SrunChannel(KeeperDial):
    """A node agent's stream through `srun --overlap` run here."""

    def __init__(self, argv: list[str]) -> None:
        super().__init__()
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,  # Ctrl-C is the launcher's to handle (scancel)
        )

    def write(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)  # type: ignore[union-attr]
        except (OSError, ValueError):
            pass  # srun has ended; its output's end says so

    def ready(self) -> bool:
        return writable(self.proc.stdin)

    def raw(self, size: int) -> bytes:
        return os.read(self.proc.stdout.fileno(), size)  # type: ignore[union-attr]

    def ended(self) -> bool:
        return self.proc.poll() is not None

    def errors(self) -> str:
        try:
            return self.proc.stderr.read().decode(errors="replace")  # type: ignore[union-attr]
        except (OSError, ValueError):
            return ""

    def hang_up(self) -> None:
        """Close srun's stdin: the dial on the node leaves, and srun ends."""
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass

    def close(self, wait: float = CLOSE_WAIT_S) -> None:
        """End the step on the node (the agent goes on: it belongs to the job); srun is
        killed if it has not ended within `wait` seconds."""
        self.hang_up()
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class LoginChannel(KeeperDial):
    """A node agent's stream through `srun --overlap` run on the login node (--login): an
    SSH channel on the launcher's connection to it (the SSH backend's SshChannel), srun's
    stdin and stdout its own."""

    def __init__(self, commands: SlurmCommands, argv: list[str]) -> None:
        from orchestrator.backends.ssh.connect import SshChannel  # paramiko: --login only

        super().__init__()
        self.ssh: SshChannel | None = None
        self.failure = ""  # why the channel could not be opened
        try:
            self.ssh = SshChannel(commands.open_stream(argv))
        except OrchestratorError as exc:
            self.failure = str(exc)

    def write(self, data: bytes) -> None:
        if self.ssh is not None:
            self.ssh.write(data)

    def ready(self) -> bool:
        return self.ssh is not None and self.ssh.ready()

    def raw(self, size: int) -> bytes:
        return self.ssh.read(size) if self.ssh is not None else b""

    def ended(self) -> bool:
        return self.ssh is None or self.ssh.ended()

    def errors(self) -> str:
        return self.ssh.errors() if self.ssh is not None else self.failure

    def hang_up(self) -> None:
        if self.ssh is not None:
            self.ssh.hang_up()

    def close(self, wait: float = CLOSE_WAIT_S) -> None:
        """srun's stdin closed, the step given `wait` seconds to end, then the channel."""
        self.hang_up()
        deadline = time.monotonic() + wait
        while not self.ended() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.ssh is not None:
            self.ssh.close()


class AllocationNode:
    """A node of the allocation as a session's node (backends/base.py's NodeLink): SLURM
    watches the node itself (a node that stops answering its slurmd fails the job,
    NODE_FAIL)."""

    def __init__(self, host: str) -> None:
        self.host = self.address = host
        self.idle_agent: IdleAgent | None = None

    def answers(self) -> bool:
        return True

    def acknowledged(self, within: float) -> bool | None:
        return None


def dial_argv(
    job_id: int, restart: int, node: int, host: str, python: str, offset: int = 0
) -> list[str]:
    """srun's command line for node `node` (`host`) of attempt `restart` of the job, its
    agent's stream from `offset`."""
    return [
        "srun",
        "--overlap",
        f"--jobid={job_id}",
        f"--nodelist={host}",
        "--nodes=1",
        "--ntasks=1",
        "--quiet",
        "--unbuffered",  # frames as they come: srun holds a task's output back to a newline
        f"--job-name=orchestrator-dial-{node}",
        python,
        "-I",
        "-S",
        "-u",
        "-c",
        DIAL,
        socket_path(job_id, restart, node),
        str(offset),
        f"{DIAL_WAIT_S:g}",
    ]


def leave_agents(sessions: Sequence[NodeSession]) -> None:
    """Close every node's srun step at once (the agents go on with the job), then wait for
    them together: CLOSE_WAIT_S in all, not per node."""
    channels = [session.channel for session in sessions]
    for channel in channels:
        channel.hang_up()  # type: ignore[attr-defined]
    deadline = time.monotonic() + CLOSE_WAIT_S
    for channel in channels:
        channel.close(wait=max(0.0, deadline - time.monotonic()))  # type: ignore[call-arg]


def reach_agent(
    job_id: int,
    restart: int,
    index: int,
    host: str,
    python: str,
    events: queue.Queue[Event],
    offset: int = 0,
    commands: SlurmCommands | None = None,
) -> NodeSession:
    """A session to node `index`'s agent (`host`), its stream from `offset`; srun runs
    where `commands` run SLURM's commands (here, or on the --login node)."""
    argv = dial_argv(job_id, restart, index, host, python, offset)
    channel = LoginChannel(commands, argv) if commands and commands.login else SrunChannel(argv)
    # Every frame in the queue, in the stream's order: the follower passes through it
    # anyway, and knows that all before a frame it handled were handled (handover.py).
    session = NodeSession(index, AllocationNode(host), channel, events, set_aside=frozenset())
    session.thread.start()
    return session
