"""The launcher's way to a SLURM job's node agents: through SLURM itself, one step for all.

Each node's agent (orchestrator.agent.keeper) listens on a Unix socket on its node. The
launcher reaches them all with one `srun --overlap --jobid JOB --ntasks-per-node=1` over the
nodes it follows, a step of the job that shares its allocation and runs
orchestrator/agent/programs/dial.py on each (its records are told there). One thread here
reads the step's stdout and feeds each node's `NodeSession` its agent's bytes, so the
agent's protocol runs over it unchanged; what a session sends goes to the step's stdin,
addressed to its node.

Why srun: it needs nothing the job does not already have (no port open on the login node
or the nodes, no file system shared with them), it is authenticated and placed by SLURM
(the node's own slurmd starts the step, as the user), and it works from wherever the user
can run srun. Why one step: a step per node cost the launcher's host two srun processes per
node (about 9 MB and 5 threads each pair) and slurmctld a step per node; one step costs two
srun processes and one thread here at any node count, and SLURM's own tree carries it.
"""

from __future__ import annotations

import base64
import os
import queue
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from importlib import resources

from orchestrator.agent.programs.dial import CHUNK_BYTES
from orchestrator.agent.relay import socket_path
from orchestrator.backends.base import IdleAgent, writable
from orchestrator.backends.sessions import Event, NodeSession
from orchestrator.errors import OrchestratorError
from orchestrator.hostlist import compress_hosts
from orchestrator.slurm.control.client import SlurmCommands

DIAL_WAIT_S = 120.0  # how long a dial waits on its node for the agent's socket
CLOSE_WAIT_S = 5.0  # for srun to end once its stdin is closed
SEND_BYTES = 3 * CHUNK_BYTES  # a command's bytes per record to the step's stdin


class SrunChannel:
    """The step's srun run here: its stdin and stdout."""

    def __init__(self, argv: list[str]) -> None:
        self.errors_file = tempfile.TemporaryFile()  # noqa: SIM115 (srun's, for its life)
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.errors_file,  # a pipe nobody reads could fill and stop srun
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

    def read(self, size: int) -> bytes:
        return os.read(self.proc.stdout.fileno(), size)  # type: ignore[union-attr]

    def ended(self) -> bool:
        return self.proc.poll() is not None

    def errors(self) -> str:
        """What srun printed to stderr so far."""
        try:
            return os.pread(self.errors_file.fileno(), 1 << 16, 0).decode(errors="replace")
        except (OSError, ValueError):
            return ""

    def release(self) -> None:
        """Its reader is done with it: srun's output and what it said are closed."""
        self.proc.stdout.close()  # type: ignore[union-attr]
        self.errors_file.close()

    def hang_up(self) -> None:
        """Close srun's stdin: the dials on the nodes leave, and srun ends."""
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass

    def close(self, wait: float = CLOSE_WAIT_S) -> None:
        """End the step on its nodes (the agents go on: they belong to the job); srun is
        killed if it has not ended within `wait` seconds."""
        self.hang_up()
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class LoginChannel:
    """The step's srun run on the login node (--login): an SSH channel on the launcher's
    connection to it (the SSH backend's SshChannel), srun's stdin and stdout its own."""

    def __init__(self, commands: SlurmCommands, argv: list[str]) -> None:
        from orchestrator.backends.ssh.agent_channel import SshChannel  # paramiko: --login only

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

    def read(self, size: int) -> bytes:
        return self.ssh.read(size) if self.ssh is not None else b""

    def ended(self) -> bool:
        return self.ssh is None or self.ssh.ended()

    def errors(self) -> str:
        return self.ssh.errors() if self.ssh is not None else self.failure

    def release(self) -> None:
        """Its reader is done with it (the channel goes in close)."""

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


class NodeDial:
    """One node's agent channel within the step (backends/base.py's AgentChannel): the
    keeper's first line (`at OFFSET LOST`) is taken off the front of its stream, and says
    where the agent's bytes start and how many before them the keeper no longer had."""

    def __init__(self, step: AllocationStep, index: int) -> None:
        self.step, self.index = step, index
        self.head: bytes | None = b""  # the keeper's first line until it is whole, then None
        self.start = 0  # the stream's offset of the first byte read (the keeper's word)
        self.lost = 0  # bytes before `start` that the keeper no longer had
        self.why = ""  # why the dial ended, once it has
        self.closed = False

    @property
    def connected(self) -> bool:
        """The keeper answered (a dial that ends before it could not reach it)."""
        return self.head is None

    def take(self, data: bytes) -> bytes:
        """The agent's bytes in `data`, after the keeper's first line."""
        if self.head is None:
            return data
        line, newline, rest = (self.head + data).partition(b"\n")
        if not newline:
            self.head = line
            return b""
        self.head = None
        words = line.split()
        if len(words) == 3 and words[0] == b"at":
            self.start, self.lost = int(words[1]), int(words[2])
        return rest

    def write(self, data: bytes) -> None:
        self.step.carry(self.index, data)

    def ready(self) -> bool:
        return self.step.channel.ready()

    def read(self, size: int) -> bytes:
        raise NotImplementedError("the step's reader feeds the session (AllocationStep)")

    def errors(self) -> str:
        return self.why

    def ended(self) -> bool:
        return self.closed

    def end(self, why: str) -> None:
        """The dial ended (`why`: the task's word, or srun's)."""
        self.closed, self.why = True, why

    def hang_up(self) -> None:
        """Nothing of its own: the step ends for all its nodes at once (leave_steps)."""

    def close(self, wait: float = CLOSE_WAIT_S) -> None:
        """As hang_up."""


class AllocationStep:
    """One srun step over some nodes of the job, each task the dial to its node's agent,
    and the sessions it feeds: started with the nodes' streams from their offsets."""

    def __init__(
        self,
        job_id: int,
        restart: int,
        hosts: dict[int, str],  # node index -> host, the nodes this step reaches
        python: str,
        events: queue.Queue[Event],
        offsets: dict[int, int],
        commands: SlurmCommands | None = None,
    ) -> None:
        argv = step_argv(job_id, restart, sorted(set(hosts.values())), python)
        self.channel: SrunChannel | LoginChannel = (
            LoginChannel(commands, argv) if commands and commands.login else SrunChannel(argv)
        )
        self.lock = threading.Lock()  # one record at a time on the step's stdin
        self.sessions: dict[int, NodeSession] = {}
        self.over = ""  # what srun said when it ended (its reader's last word)
        self.ends = threading.Lock()  # between a new session and the step's end
        for index, host in hosts.items():
            self.sessions[index] = self._session(index, host, events)
        self.thread = threading.Thread(target=self._read, name="agents-step", daemon=True)
        self.thread.start()
        for index, host in hosts.items():
            self.dial(index, host, offsets.get(index, 0))

    def _session(self, index: int, host: str, events: queue.Queue[Event]) -> NodeSession:
        channel = NodeDial(self, index)
        return NodeSession(index, AllocationNode(host), channel, events, set_aside=frozenset())

    def redial(self, index: int, host: str, offset: int) -> NodeSession:
        """A new session to node `index`'s agent through this step, its stream from
        `offset` (its last one closed); closed at once if the step has just ended."""
        old = self.sessions[index]
        with self.ends:
            session = self.sessions[index] = self._session(index, host, old.events)
            if self.over:
                session.channel.end(self.over)  # type: ignore[attr-defined]
                session.ended(self.over)
                return session
        self.dial(index, host, offset)
        return session

    def dial(self, index: int, host: str, offset: int) -> None:
        """Tell the task on `host` to dial node `index`'s agent, its stream from `offset`."""
        self._write(f"d {index} {host} {offset}\n".encode())

    def carry(self, index: int, data: bytes) -> None:
        """Bytes for node `index`'s agent, through its node's task."""
        records = [
            b"s %d %s\n" % (index, base64.b64encode(data[at : at + SEND_BYTES]))
            for at in range(0, len(data), SEND_BYTES)
        ]
        self._write(b"".join(records))

    def _write(self, data: bytes) -> None:
        with self.lock:
            self.channel.write(data)

    def ended(self) -> bool:
        return self.channel.ended()

    def _read(self) -> None:
        """The step's records, each to its node's session, until srun ends; then every
        session still open is told, with what srun said."""
        pending, why = b"", ""
        try:
            while data := self.channel.read(1 << 20):
                *lines, pending = (pending + data).split(b"\n")
                for line in lines:
                    self._record(line)
        except (OSError, EOFError) as exc:
            why = f"{exc}\n"
        self._end_all(why or self.channel.errors() or "srun ended\n")
        self.channel.release()

    def _record(self, line: bytes) -> None:
        words = line.split()
        if len(words) not in (2, 3) or words[0] not in (b"o", b"c") or not words[1].isdigit():
            return  # not the dial's (a site's prolog or srun's own words on stdout)
        session = self.sessions.get(int(words[1]))
        if session is None or not session.reading:
            return  # a node this step does not follow, or whose agent said X
        channel: NodeDial = session.channel  # type: ignore[assignment]
        payload = base64.b64decode(words[2]) if len(words) == 3 else b""
        if words[0] == b"c":
            channel.end(payload.decode(errors="replace"))
            session.ended(channel.why + "\n")
            return
        try:
            data = channel.take(payload)
            if data:
                session.feed(data)
        except ValueError as exc:
            channel.end(str(exc))
            session.ended(f"{exc}\n")

    def _end_all(self, why: str) -> None:
        with self.ends:
            self.over = why
            sessions = list(self.sessions.values())
        for session in sessions:
            channel: NodeDial = session.channel  # type: ignore[assignment]
            if session.reading:
                session.ended(why)
            channel.end(channel.why or why)

    def hang_up(self) -> None:
        self.channel.hang_up()

    def close(self, wait: float = CLOSE_WAIT_S) -> None:
        self.channel.close(wait=wait)


def step_argv(job_id: int, restart: int, hosts: Sequence[str], python: str) -> list[str]:
    """srun's command line for the step over `hosts` in attempt `restart` of the job: a
    task per node, every task given the whole of srun's stdin (`--input=all`), their
    stdout merged by whole lines (no --unbuffered: that would give each task a terminal and
    pass its output on in any pieces)."""
    return [
        "srun",
        "--overlap",
        f"--jobid={job_id}",
        f"--nodelist={compress_hosts(hosts)}",
        f"--nodes={len(hosts)}",
        f"--ntasks={len(hosts)}",
        "--ntasks-per-node=1",
        "--input=all",
        "--kill-on-bad-exit=0",  # one node's dial failing leaves the others'
        "--quiet",
        "--job-name=orchestrator-agents",
        python,
        "-I",
        "-S",
        "-u",
        "-c",
        resources.files("orchestrator").joinpath("agent/programs/dial.py").read_text("utf-8"),
        socket_path(job_id, restart, "{}"),
        f"{DIAL_WAIT_S:g}",
    ]


def leave_steps(steps: Sequence[AllocationStep]) -> None:
    """Close every step at once (the agents go on with the job), then wait for them
    together: CLOSE_WAIT_S in all."""
    for step in steps:
        step.hang_up()
    deadline = time.monotonic() + CLOSE_WAIT_S
    for step in steps:
        step.close(wait=max(0.0, deadline - time.monotonic()))
