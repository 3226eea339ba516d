"""The controller's side of a node agent (orchestrator.backends.sessions): the frames that need no
prompt answer do not wake the supervision loop, and what goes to a node never waits for a
node that cannot take it.

A node whose sshd stops reading its socket (the node frozen, or starved and swapped out
while hundreds of torchruns start on it) makes a write to it wait until the socket drains.
The channel here stands in for such a node at the network's edge: `ready()` says no, and
a write waits until the test lets it through. What must hold: heartbeats and stops reach
every other node at once, and the stuck node gets its stop afterwards, in order. And
`SshChannel.ready()` sees a full last hop behind a ProxyCommand, and a start hands the
nodes whose agent waits idle their step before it waits for new agents."""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
import time
from pathlib import Path

import paramiko

from orchestrator.agent.protocol import frame
from orchestrator.backends.base import IdleAgent
from orchestrator.backends.sessions import NodeSession, start_sessions
from orchestrator.backends.ssh.agent_channel import SshChannel
from orchestrator.backends.ssh.connect import tcp_acks
from orchestrator.supervise import NodeState
from orchestrator.supervise.stopping import Stopper
from tests.factories import supervisor, world


class Channel:
    """An agent channel: records what was written; `stuck` makes writes wait, and with
    `looks_ready` ready() says yes all the same (a kernel send held for memory). Its agent
    says nothing and ends when the channel is closed."""

    def __init__(self, stuck: bool = False, looks_ready: bool = False) -> None:
        self.written: list[bytes] = []
        self.stuck = stuck
        self.looks_ready = looks_ready
        self.released = threading.Event()
        self.closed = threading.Event()
        self.lock = threading.Lock()

    def ready(self) -> bool:
        return self.looks_ready or not self.stuck

    def write(self, data: bytes) -> None:
        with self.lock:  # one write at a time, as SshChannel.write
            if self.stuck:
                self.released.wait(30)
            self.written.append(data)

    def lines(self) -> list[str]:
        return b"".join(self.written).decode().split()

    def read(self, size: int) -> bytes:
        self.closed.wait(30)
        return b""

    def errors(self) -> str:
        return ""

    def close(self) -> None:
        self.closed.set()


class Notes:
    def note(self, text: str) -> None:
        pass


def sessions_with_one_stuck(looks_ready: bool = False) -> tuple[list[Channel], list[NodeSession]]:
    channels = [Channel(), Channel(stuck=True, looks_ready=looks_ready), Channel()]
    sessions = [NodeSession(i, None, c, queue.Queue()) for i, c in enumerate(channels)]
    return channels, sessions


def _until(condition, seconds: float = 5) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_heartbeats_and_stops_reach_the_other_nodes_while_one_node_is_stuck() -> None:
    channels, sessions = sessions_with_one_stuck()
    nodes = [NodeState(index=i, host=f"n{i}") for i in range(3)]
    stopper = Stopper(nodes, sessions, Notes(), grace=3)
    started = time.monotonic()
    stopper.heartbeat()
    stopper.heartbeat()
    stopper.begin(3, "rank 2 failed")
    assert time.monotonic() - started < 1.0  # nothing waited for the stuck node
    for channel in (channels[0], channels[2]):
        words = channel.lines()
        assert words[0::2] == ["hb", "hb", "stop"] and words[-1] == "3"
    assert channels[1].written == []
    channels[1].stuck = False
    channels[1].released.set()
    _until(lambda: "stop" in channels[1].lines())
    # The heartbeats found its socket full and were dropped (they would be stale); the
    # stop was kept for it.
    assert channels[1].lines() == ["stop", "3"]


def test_a_send_the_kernel_holds_holds_one_heartbeat_round_only() -> None:
    # The node's socket looks writable, yet the write waits: seen at 250 nodes with the
    # machine out of memory, the one heartbeat thread sat in a socket send and no node
    # heard the controller for 600 s. Each round has a thread of its own now.
    channels, sessions = sessions_with_one_stuck(looks_ready=True)
    nodes = [NodeState(index=i, host=f"n{i}") for i in range(3)]
    stopper = Stopper(nodes, sessions, Notes(), grace=3)
    stopper.heartbeat_round()  # writes to node 0, then waits on node 1
    _until(lambda: sessions[1].beating, 30)
    stopper.heartbeat_round()  # node 0 and node 2: node 1's heartbeat is still under way
    _until(lambda: channels[2].lines()[:1] == ["hb"], 30)
    assert sessions[1].beating and channels[1].written == []  # still held, all along
    started = time.monotonic()
    stopper.begin(3, "rank 2 failed")
    assert time.monotonic() - started < 5.0  # the stop does not wait for node 1 (30 s)
    assert channels[0].lines()[0::2] == ["hb", "hb", "stop"]
    assert channels[2].lines()[0::2] == ["hb", "stop"]
    channels[1].stuck = False
    channels[1].released.set()
    _until(lambda: "stop" in channels[1].lines())
    assert channels[1].lines()[0::2] == ["hb", "stop"]  # the held heartbeat, then the stop


def test_lines_to_a_stuck_node_keep_their_order() -> None:
    channels, sessions = sessions_with_one_stuck()
    stuck = sessions[1]
    for line in ("stop 3", "hb 1.0", "kill"):
        stuck.send(line, may_skip=line.startswith("hb"))
    channels[1].stuck = False
    channels[1].released.set()
    _until(lambda: stuck.backlog is None)
    assert channels[1].lines() == ["stop", "3", "kill"]
    stuck.send("hb 2.0", may_skip=True)  # the backlog is written: sends go straight out again
    assert channels[1].lines()[-2:] == ["hb", "2.0"]


class _Frames:
    """An agent channel that delivers the given bytes, then ends."""

    def __init__(self, data: bytes) -> None:
        self.data = [data]

    def read(self, size: int) -> bytes:
        return self.data.pop(0) if self.data else b""

    def errors(self) -> str:
        return ""


def test_heartbeats_and_samples_reach_the_run_without_waking_the_loop(tmp_path: Path) -> None:
    # The node's clock is 5 s ahead: hb sent at t1 (ours), read at t2 and answered at t3
    # (its), received about now (ours): one round trip of about 0.2 s.
    t1 = time.time() - 0.2
    t2 = t3 = t1 + 0.1 + 5.0
    events: queue.Queue = queue.Queue()
    beat = frame("H", f"{t3:.6f}", f"{t1:.6f}", f"{t2:.6f}")
    sample = frame("P", payload=b'{"cpu_percent": 7}')
    channel = _Frames(beat + sample + frame("M", payload=b"hi"))
    session = NodeSession(0, None, channel, events)
    session.thread.start()
    session.thread.join(timeout=5)
    kinds = []
    while not events.empty():
        kinds.append(events.get_nowait().kind)
    assert kinds == ["M", "EOF"]  # the beat and the sample did not go through the queue
    nodes, ranks = world(("a",), 0)
    metrics = tmp_path / "metrics.jsonl"
    sup = supervisor(
        tmp_path, nodes=nodes, ranks=ranks, sessions=[session], events=events, metrics_path=metrics
    )
    sup.take_aside()
    best = nodes[0].clock.best()
    assert best is not None and abs(best.offset - 5.0) <= best.error + 0.01
    sup.metrics.flush()
    assert '"sample":{"cpu_percent":7}' in metrics.read_text()
    assert not session.aside and nodes[0].heard_wall >= t1


class _Transport:
    def __init__(self, sock) -> None:
        self.sock = sock


class _Channel:
    """The paramiko channel's side that `SshChannel.ready()` asks: its window is open."""

    def __init__(self, sock) -> None:
        self.transport = _Transport(sock)

    def send_ready(self) -> bool:
        return True

    def get_transport(self) -> _Transport:
        return self.transport


def test_ready_says_no_while_a_proxy_command_does_not_read() -> None:
    """Behind a ProxyCommand the last hop is a pipe to a process: a proxy that stops
    reading (stuck on its own connection) fills the pipe, and then a write would wait."""
    proxy = paramiko.ProxyCommand("sleep 30")  # a real process that never reads its stdin
    try:
        channel = SshChannel(_Channel(proxy))
        assert channel.ready()
        pipe = proxy.process.stdin.fileno()
        os.set_blocking(pipe, False)
        with contextlib.suppress(BlockingIOError):
            while True:
                os.write(pipe, b"x" * 4096)
        assert not channel.ready()
    finally:
        proxy.close()


class _Node:
    """A connection whose new agents wait for `opened` (a node too busy to open a channel
    soon), with an idle agent from an earlier step or none."""

    def __init__(self, opened: threading.Event, idle: bool) -> None:
        self.opened = opened
        self.idle_agent = IdleAgent("py", "run", Channel(), time.monotonic()) if idle else None

    def start_agent(self, python: str, tag: str) -> Channel:
        self.opened.wait(30)
        return Channel()


def test_idle_agents_start_before_new_ones_however_many_wait_to_open() -> None:
    """More nodes than start threads: the nodes whose agent waits idle must get their step
    at once, not after the new agents' channels open (an idle agent leaves after IDLE_S)."""
    opened = threading.Event()
    nodes = [_Node(opened, idle=i >= 70) for i in range(74)]  # the idle ones come last
    idle = [node.idle_agent.channel for node in nodes[70:]]
    starts = [(i, node, "py", "run", {"step": i}) for i, node in enumerate(nodes)]
    sessions: list[NodeSession] = []
    starting = threading.Thread(target=start_sessions, args=(starts, queue.Queue(), sessions))
    starting.start()
    try:
        # A session joins `sessions` just after its write: wait for both, not the writes.
        _until(lambda: all(agent.written for agent in idle) and len(sessions) >= 4)
        assert all(b"".join(agent.written).startswith(b"next\n") for agent in idle)
        assert sorted(s.index for s in sessions) == [70, 71, 72, 73]
    finally:
        opened.set()
        starting.join(timeout=30)
        for session in sessions:
            session.channel.close()
    assert len(sessions) == 74


def test_tcp_acks_reads_the_kernels_last_acknowledgement_not_the_last_data() -> None:
    # The peer (a node whose agent is silent) sends no data for 1.5 s, then acknowledges a
    # byte we send: the time since its last acknowledgement is short, since its data long.
    server = socket.create_server(("127.0.0.1", 0))
    with server, socket.create_connection(server.getsockname()) as ours:
        peer, _ = server.accept()
        with peer:
            time.sleep(1.5)
            ours.sendall(b"x")
            assert peer.recv(1) == b"x"
            acks = tcp_acks(ours)
    if acks is None:
        return  # not Linux: no tcp_info, and the controller never counts on it
    unacked, since_ack = acks
    assert unacked == 0
    assert since_ack < 1.0, since_ack  # tcpi_last_data_recv would be past 1.5 s
