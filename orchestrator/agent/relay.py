"""The keeper's Unix socket on the node, between the agent's pipes and one controller at a
time (keeper.py): a controller reaches it through SLURM (one `srun --overlap --jobid JOB`
step for the whole allocation, running programs/dial.py on every node), says from which offset it
wants the stream (replay.py), gets it from there and then live, and what it sends are the
agent's commands. A new connection replaces the old.

Standard library only: this module runs on the nodes (see orchestrator.agent.bootstrap).
"""

from __future__ import annotations

import os
import selectors
import socket
import stat
import sys
import threading
from collections import deque

from orchestrator.agent.protocol import Frame
from orchestrator.agent.replay import Stream

SEND_BYTES = 1 << 16


def socket_path(
    job_id: str | int, restart: str | int, node: str | int, uid: str | int | None = None
) -> str:
    """Where node `node`'s keeper listens in attempt `restart` of SLURM job `job_id`: a
    folder of the user's own (`uid`, this process's by default) in the node's /tmp (a
    job's private /tmp, where the site gives jobs one, is shared by all its steps)."""
    uid = os.getuid() if uid is None else uid
    return f"/tmp/orchestrator-agent-{uid}/{job_id}.{restart}.{node}.sock"


class Relay:
    """Between the agent's pipes and one controller at a time on the node's socket."""

    def __init__(
        self,
        path: str,
        agent_out: int,
        agent_in: int,
        echo: tuple[int, int] | None,
        own: deque[bytes] | None = None,
    ) -> None:
        self.listener = listen(path)
        self.path = path
        self.agent_out, self.agent_in, self.echo = agent_out, agent_in, echo
        self.stream = Stream()
        self.client: socket.socket | None = None
        self.hello = b""  # the controller's first line, until it is whole
        self.sent: int | None = None  # the offset up to which the controller has it
        self.agent_done = False
        # Frames of the keeper's own (the time limit's warning), put into the stream at
        # the next end of one of the agent's; appended to from the signal handler.
        self.own: deque[bytes] = deque() if own is None else own
        self.selector = selectors.DefaultSelector()
        if self.listener is not None:
            self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(agent_out, selectors.EVENT_READ, "agent")

    def run(self, until: threading.Event) -> None:
        while not until.is_set():
            self.step(0.2)

    def step(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout):
            if key.data == "accept":
                self.accept()
            elif key.data == "agent":
                self.from_agent()
            elif key.data == "client":
                self.from_client()
        while self.own and self.stream.at_frame_end():
            self.stream.add(self.own.popleft())
        self.to_client()

    def accept(self) -> None:
        assert self.listener is not None
        conn, _ = self.listener.accept()
        self.drop_client()
        conn.setblocking(False)
        self.client, self.hello, self.sent = conn, b"", None
        self.selector.register(conn, selectors.EVENT_READ, "client")

    def drop_client(self) -> None:
        if self.client is not None:
            self.selector.unregister(self.client)
            self.client.close()
        self.client, self.sent = None, None

    def from_agent(self) -> None:
        data = os.read(self.agent_out, 1 << 20)
        if not data:
            self.selector.unregister(self.agent_out)
            self.agent_done = True
            return
        for kind, body in self.stream.add(data):
            if self.echo is None:
                continue
            if kind == Frame.SCRIPT_OUTPUT.value:
                write_all(self.echo[0], body)
            else:
                write_all(self.echo[1], b"orchestrator agent: " + body.rstrip(b"\n") + b"\n")

    def from_client(self) -> None:
        assert self.client is not None
        try:
            data = self.client.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.drop_client()
            return
        if self.sent is None:
            self.hello += data
            if b"\n" not in self.hello:
                return
            line, _, data = self.hello.partition(b"\n")
            words = line.split()
            asked = int(words[1]) if len(words) == 2 and words[1].isdigit() else 0
            self.sent, lost = self.stream.since(asked)
            self.client.setblocking(True)
            self.client.sendall(b"at %d %d\n" % (self.sent, lost))
            self.client.setblocking(False)
        if data:
            write_all(self.agent_in, data)  # the agent's commands

    def to_client(self) -> None:
        stream = self.stream
        if self.sent is not None and self.sent < stream.base:
            self.drop_client()  # it fell KEPT_BYTES behind: it asks again, and learns the loss
        while self.client is not None and self.sent is not None and self.sent < stream.end:
            start = self.sent - stream.base
            try:
                self.sent += self.client.send(stream.kept[start : start + SEND_BYTES])
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.drop_client()
                return

    def taken(self) -> bool:
        """Whether no controller waits for more: none is connected, or it has it all."""
        return self.client is None or (self.sent is not None and self.sent >= self.stream.end)

    def close(self) -> None:
        self.drop_client()
        if self.listener is None:
            return
        self.listener.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def private_folder(path: str) -> None:
    """Make (or check) the user's own folder for the sockets: a folder another user made
    (or can write to) in /tmp could serve or swap our socket; refuse it."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise OSError(f"{path} is not a folder of this user's alone (mode 700)")


def listen(path: str) -> socket.socket | None:
    """The node's socket for controllers, or None (said on stderr) where it cannot be made:
    the job runs all the same, without a way in for the launcher."""
    try:
        private_folder(os.path.dirname(path))
        if os.path.exists(path):
            os.unlink(path)  # an earlier job's with the same numbers: ours now
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(path)
        listener.listen(8)
        return listener
    except OSError as error:
        print(f"orchestrator agent: no socket for the launcher: {error}", file=sys.stderr)
        return None


def write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass  # the reader is gone; the stream still keeps it
