"""The controller's side of a node agent (orchestrator.nodes): what goes to a node never
waits for a node that cannot take it.

A node whose sshd stops reading its socket (the node frozen, or starved and swapped out
while hundreds of torchruns start on it) makes a write to it wait until the socket drains.
The channel here stands in for such a node at the network's edge: `ready()` says no, and
a write waits until the test lets it through. What must hold: heartbeats and stops reach
every other node at once, and the stuck node gets its stop afterwards, in order."""

from __future__ import annotations

import queue
import threading
import time

from orchestrator.nodes import NodeSession
from orchestrator.supervise import NodeState
from orchestrator.supervise.stopping import Stopper


class Channel:
    """An agent channel: records what was written; `stuck` makes writes wait."""

    def __init__(self, stuck: bool = False) -> None:
        self.written: list[bytes] = []
        self.stuck = stuck
        self.released = threading.Event()

    def ready(self) -> bool:
        return not self.stuck

    def write(self, data: bytes) -> None:
        if self.stuck:
            self.released.wait(30)
        self.written.append(data)

    def lines(self) -> list[str]:
        return b"".join(self.written).decode().split()


class Notes:
    def note(self, text: str) -> None:
        pass


def sessions_with_one_stuck() -> tuple[list[Channel], list[NodeSession]]:
    channels = [Channel(), Channel(stuck=True), Channel()]
    sessions = [NodeSession(i, None, c, queue.Queue()) for i, c in enumerate(channels)]
    return channels, sessions


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
    deadline = time.monotonic() + 5
    while "stop" not in channels[1].lines() and time.monotonic() < deadline:
        time.sleep(0.01)
    # The first heartbeat was under way when the node got stuck; the second, sent while it
    # still waited, was dropped (it would be stale); the stop was kept, and came after it.
    assert channels[1].lines()[0::2] == ["hb", "stop"]


def test_lines_to_a_stuck_node_keep_their_order() -> None:
    channels, sessions = sessions_with_one_stuck()
    stuck = sessions[1]
    for line in ("stop 3", "hb 1.0", "kill"):
        stuck.send(line, may_skip=line.startswith("hb"))
    channels[1].stuck = False
    channels[1].released.set()
    deadline = time.monotonic() + 5
    while stuck.backlog is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert channels[1].lines() == ["stop", "3", "kill"]
    stuck.send("hb 2.0", may_skip=True)  # the backlog is written: sends go straight out again
    assert channels[1].lines()[-2:] == ["hb", "2.0"]
