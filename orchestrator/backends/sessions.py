"""The controller's side of each node agent: start it, talk to it, turn its frames into events.

An agent that finished its step cleanly is kept on its connection, and the next step of the
same run there reuses it (see orchestrator.agent): the launch's preflight probe and its job
cost one SSH session per node, not two.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from orchestrator.agent import IDLE_S, agent_start, encode_config
from orchestrator.agent.protocol import WITH_PAYLOAD, Frame, command_line, next_command
from orchestrator.backends.base import AgentChannel, IdleAgent, NodeConnection, NodeLink
from orchestrator.backends.readers import READERS

REUSE_WITHIN_S = IDLE_S / 2  # an agent idle for longer may be about to leave: start another
# Heartbeats, node samples and metrics records: each node sends them every few seconds
# whether anything happens or not, so on a quiet run of N nodes, waking the loop for each
# would cost N wake-ups every beat. They wait in their session for the loop's next pass.
ASIDE = frozenset({Frame.HEARTBEAT, Frame.NODE_SAMPLE, Frame.METRICS})
# The kind of a session's last event when its channel closed: the controller's, no frame.
CHANNEL_CLOSED = "EOF"
PUT_WAIT_S = 0.5  # a reader's wait on a full queue, between looks at whether it still must


@dataclass(frozen=True)
class Event:
    """One thing a node said: `kind` is a frame's (orchestrator.agent.protocol.Frame) or
    CHANNEL_CLOSED."""

    node: int  # index of the node in the plan
    kind: str
    fields: tuple[str, ...] = ()
    data: bytes = b""
    at: float = 0.0  # when the controller received it (wall clock)
    # The channel's bytes read through this frame's end (a channel that can resume at an
    # offset, orchestrator.slurm.following.agents, says from where it asks next).
    end: int = 0


class FrameParser:
    """Incremental decoder of the agent's frames (see orchestrator.agent)."""

    WITH_PAYLOAD = WITH_PAYLOAD  # the protocol's

    def __init__(self) -> None:
        self.buf = bytearray()
        self.consumed = 0  # bytes of the stream before `buf`

    def feed(self, data: bytes) -> list[tuple[str, tuple[str, ...], bytes]]:
        """The frames `data` completes: (kind, fields, payload)."""
        return [item[:3] for item in self.frames(data)]

    def frames(self, data: bytes) -> list[tuple[str, tuple[str, ...], bytes, int]]:
        """The frames `data` completes, each with the stream's bytes through its end."""
        self.buf += data
        frames = []
        while True:
            newline = self.buf.find(b"\n")
            if newline < 0:
                break
            words = bytes(self.buf[:newline]).decode("ascii", errors="replace").split()
            if not words:
                del self.buf[: newline + 1]
                self.consumed += newline + 1
                continue
            kind, fields = words[0], tuple(words[1:])
            if kind in self.WITH_PAYLOAD:
                if not fields or not fields[-1].isdigit():
                    raise ValueError(f"bad frame header from the agent: {words!r}")
                size = int(fields[-1])
                end = newline + 1 + size
                if len(self.buf) < end:
                    break
                payload = bytes(self.buf[newline + 1 : end])
                del self.buf[:end]
                self.consumed += end
                frames.append((kind, fields[:-1], payload, self.consumed))
            else:
                del self.buf[: newline + 1]
                self.consumed += newline + 1
                frames.append((kind, fields, b"", self.consumed))
        return frames


class NodeSession:
    """A started agent on one node; its frames go to a shared queue as `Event`s."""

    def __init__(
        self,
        index: int,
        connection: NodeLink,  # the node: a connection, or a node SLURM watches itself
        channel: AgentChannel,
        events: queue.Queue[Event],
        python: str = "",
        tag: str = "",
        set_aside: frozenset[str] = ASIDE,
    ) -> None:
        self.index = index
        self.set_aside = set_aside  # kinds kept in `aside` (none: all in stream order)
        self.connection = connection
        self.channel = channel
        self.events = events
        self.python = python
        self.tag = tag
        self.finished = False  # the agent said X: it now waits for another step
        self.heard = time.monotonic()  # when its reader last got bytes from the agent
        self.sent_at: float | None = None  # when its step's config was sent (wall clock)
        # Frames that need no prompt answer wait here for the loop's next pass (at most a
        # second away) instead of waking it: see ASIDE and Supervisor.take_aside.
        self.aside: deque[Event] = deque()
        self.lock = threading.Lock()
        self.backlog: bytearray | None = None  # lines a background write still has to send
        self.beating = False  # a heartbeat's write is under way (outside the lock)
        self.parser = FrameParser()
        self.reading = True  # until the channel closes or the agent's X comes
        # Read by the controller's one reader (orchestrator.backends.readers) when the
        # channel can be waited on; else by a thread of its own, or by whoever reads many
        # sessions' channels at once (see feed). Neither starts before begin_reading.
        self.shared = hasattr(channel, "read_waiting")
        self.fd: int | None = None  # the descriptor the shared reader waits on
        self.closed = False  # by close(): what it still reads goes nowhere
        self.thread = threading.Thread(target=self._read, name=f"node{index}-reader", daemon=True)

    @classmethod
    def start(
        cls,
        index: int,
        connection: NodeConnection,
        python: str,
        tag: str,
        config: dict,
        events: queue.Queue[Event],
        channel: AgentChannel | None = None,
    ) -> NodeSession:
        """Run a step on the node: on `channel`, an idle agent of the connection's (see
        take_idle_agent), or else a new agent."""
        if channel is not None:
            head = command_line(next_command())
        else:
            channel = connection.start_agent(python, tag)
            head = agent_start()
        session = cls(index, connection, channel, events, python, tag)
        session.sent_at = time.time()
        channel.write(head + encode_config(config))
        session.begin_reading()
        return session

    def begin_reading(self) -> None:
        """Read the channel from now on: its frames become events."""
        if self.shared:
            self.fd = self.channel.fileno()  # type: ignore[attr-defined]
            READERS.add(self.fd, self)
        else:
            self.thread.start()

    def done_reading(self) -> None:
        """Read the channel no more (the shared reader's; a thread of its own ends with
        the channel's end or the agent's X)."""
        if self.fd is not None:
            READERS.remove(self.fd, self)

    def answers(self) -> bool:
        """Whether the node itself (its sshd) answers now; blocks until it does or the
        connection dies, so callers ask from a thread of their own."""
        return self.connection.answers()

    def acknowledged(self, within: float) -> bool | None:
        """Whether the node's kernel acknowledged our packets lately (never blocks)."""
        return self.connection.acknowledged(within)

    def send(self, command: str, may_skip: bool = False) -> None:
        """Send a command line without ever blocking the caller: a node that cannot take
        bytes now (frozen, or its sshd starved or swapped out, so its socket is full) gets
        them from a thread of its own, in order, while the caller goes on to the other
        nodes. A `may_skip` line (a heartbeat) is dropped while such a write waits, or
        while the heartbeat before it is still being written: the kernel can hold a send
        even when the socket looked writable (a machine out of memory), so heartbeats are
        written outside the lock, by a thread that may wait (see Supervisor._beat)."""
        data = command_line(command)
        with self.lock:
            waits = self.backlog is not None or self.beating or not self.channel.ready()
            if may_skip:
                if waits:
                    return  # it would be stale by the time the node reads it
                self.beating = True
            elif self.backlog is not None:
                self.backlog += data
                return
            elif not waits:
                self.channel.write(data)
                return
            else:
                self.backlog = bytearray(data)  # behind a full socket or a heartbeat
        if may_skip:
            try:
                self.channel.write(data)  # may wait on a starved machine: this round only
            finally:
                with self.lock:
                    self.beating = False
            return
        writer = threading.Thread(target=self._write_backlog, name=f"node{self.index}-writer")
        writer.daemon = True  # a node stuck for good must not keep the controller from exiting
        writer.start()

    def _write_backlog(self) -> None:
        while True:
            with self.lock:
                data = bytes(self.backlog or b"")
                self.backlog = bytearray() if data else None
            if not data:
                return
            self.channel.write(data)  # may wait as long as the node does: this thread only

    def _read(self) -> None:
        """The session's own reader: the channel's bytes, until it ends or the agent's X."""
        try:
            while True:
                data = self.channel.read(1 << 20)
                if not data or not self.feed(data):
                    break
        except (OSError, EOFError, ValueError) as exc:
            self.ended(f"{exc}\n")
            return
        if self.reading:
            self.ended(self.channel.errors())

    def read_here(self) -> bool:
        """What waits on the channel, read by the shared reader without blocking; False
        once nothing more is to be read (the agent's X, or the channel's end)."""
        try:
            data = self.channel.read_waiting()  # type: ignore[attr-defined]
            if data is None:
                return True  # woken with nothing whole to read yet
            if data:
                return self.feed(data)
        except (OSError, EOFError, ValueError) as exc:
            self.ended(f"{exc}\n")
            return False
        # What the agent said on stderr may take a moment to read (a local agent's
        # children can hold its stderr open): not on the thread that reads every node.
        threading.Thread(target=self._end, name=f"node{self.index}-end", daemon=True).start()
        return False

    def _end(self) -> None:
        self.ended(self.channel.errors())

    def feed(self, data: bytes) -> bool:
        """Bytes of the agent's stream, read by this session's thread or by whoever reads
        many sessions' channels at once (orchestrator.slurm.following.agents): its
        frames become events. False once the agent's last frame (X) came: nothing follows
        until another step. ValueError: bytes that are no frames."""
        self.heard = time.monotonic()
        at = time.time()
        for kind, fields, payload, end in self.parser.frames(data):
            event = Event(self.index, kind, fields, payload, at, end)
            if kind in self.set_aside:
                self.aside.append(event)
                continue
            self.finished = kind == Frame.FINISHED  # nothing follows until another step
            self._put(event)
            if self.finished:
                self.reading = False
                return False
        return True

    def ended(self, why: str) -> None:
        """The channel closed before the agent's X (`why`: what it said)."""
        self.reading = False
        self._put(Event(self.index, CHANNEL_CLOSED, (), why.encode()))

    def _put(self, event: Event) -> None:
        """Queue an event; while the queue is full, wait for the loop to take some, unless
        the session is closed meanwhile (its attempt is over, and nobody will): the one
        reader of every node must not wait for good on a queue no loop reads."""
        while True:
            try:
                self.events.put(event, timeout=PUT_WAIT_S)
                return
            except queue.Full:
                if self.closed:
                    return

    def close(self) -> None:
        """Keep the agent on its connection for another step when it finished cleanly;
        otherwise close its channel, which ends it (and stops what it runs). Either way
        the shared reader reads it no more: no end of its channel becomes an event."""
        self.closed = True
        if self.finished and self.thread.ident is not None:
            self.thread.join(timeout=5)
        self.done_reading()
        if not self.finished or self.thread.is_alive():
            self.channel.close()
            return
        previous = self.connection.idle_agent
        # Idle since its X arrived (the agent's wait began then), not since now: a loaded
        # controller may handle the X many seconds later, and then reuse an agent that left.
        self.connection.idle_agent = IdleAgent(self.python, self.tag, self.channel, self.heard)
        if previous is not None:
            previous.channel.close()


def start_sessions(
    starts: Sequence[tuple[int, NodeConnection, str, str, dict]],
    events: queue.Queue[Event],
    into: list[NodeSession] | None = None,
) -> list[NodeSession]:
    """Start (index, connection, python, tag, config) agents on all their nodes at once;
    each session is also appended to `into` as soon as it has started (heartbeats reach
    it while the others start).

    Each start waits for its node to open a channel and run a command: in turn, those
    round trips would add up with the node count. Nodes whose agent waits idle (from the
    preflight) are taken, all of them, before any starts, and go first: for them a start
    is one write, while a new agent's channel may take long to open on a node already
    busy, and an idle agent left waiting behind those would leave (IDLE_S). If any start
    fails, the others are closed (which stops their agents) and the first error is raised.
    """
    idle = [take_idle_agent(one[1], one[2], one[3]) for one in starts]
    order = sorted(range(len(starts)), key=lambda i: idle[i] is None)

    def start(i: int) -> NodeSession:
        session = NodeSession.start(*starts[i], events, idle[i])
        if into is not None:
            into.append(session)
        return session

    with ThreadPoolExecutor(max_workers=min(64, max(1, len(starts)))) as pool:
        submitted = {i: pool.submit(start, i) for i in order}
    futures = [submitted[i] for i in range(len(starts))]
    sessions, errors = [], []
    for future in futures:
        try:
            sessions.append(future.result())
        except Exception as exc:
            errors.append(exc)
    if errors:
        for session in sessions:
            session.close()
        raise errors[0]
    return sessions


def take_idle_agent(connection: NodeConnection, python: str, tag: str) -> AgentChannel | None:
    """The connection's idle agent if it can run a step for `tag` with `python`."""
    idle, connection.idle_agent = connection.idle_agent, None
    if idle is None:
        return None
    if (idle.python, idle.tag) == (python, tag) and time.monotonic() - idle.since < REUSE_WITHIN_S:
        return idle.channel
    idle.channel.close()
    return None
