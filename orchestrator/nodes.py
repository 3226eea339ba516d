"""The controller's side of each node agent: start it, talk to it, turn its frames into events."""

from __future__ import annotations

import json
import queue
import threading
from dataclasses import dataclass
from importlib import resources

from orchestrator.agent import length_prefixed
from orchestrator.backends.base import AgentChannel, NodeConnection

_AGENT_SOURCE: bytes | None = None


def agent_source() -> bytes:
    global _AGENT_SOURCE
    if _AGENT_SOURCE is None:
        _AGENT_SOURCE = resources.files("orchestrator").joinpath("agent.py").read_bytes()
    return _AGENT_SOURCE


@dataclass(frozen=True)
class Event:
    """One thing a node said: `kind` is a frame type (S O N E F M H X) or "EOF"."""

    node: int  # index of the node in the plan
    kind: str
    fields: tuple[str, ...] = ()
    data: bytes = b""


class FrameParser:
    """Incremental decoder of the agent's frames (see orchestrator.agent)."""

    WITH_PAYLOAD = {"O", "N", "F", "M"}

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[str, tuple[str, ...], bytes]]:
        self.buf += data
        frames = []
        while True:
            newline = self.buf.find(b"\n")
            if newline < 0:
                break
            words = bytes(self.buf[:newline]).decode("ascii", errors="replace").split()
            if not words:
                del self.buf[: newline + 1]
                continue
            kind, fields = words[0], tuple(words[1:])
            if kind in self.WITH_PAYLOAD:
                if not fields or not fields[-1].isdigit():
                    raise ValueError(f"bad frame header from the agent: {words!r}")
                size = int(fields[-1])
                end = newline + 1 + size
                if len(self.buf) < end:
                    break
                payload = bytes(self.buf[newline + 1: end])
                del self.buf[:end]
                frames.append((kind, fields[:-1], payload))
            else:
                del self.buf[: newline + 1]
                frames.append((kind, fields, b""))
        return frames


class NodeSession:
    """A started agent on one node; its frames go to a shared queue as `Event`s."""

    def __init__(self, index: int, connection: NodeConnection, channel: AgentChannel,
                 events: queue.Queue[Event]) -> None:
        self.index = index
        self.connection = connection
        self.channel = channel
        self.events = events
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, name=f"node{index}-reader",
                                       daemon=True)

    @classmethod
    def start(cls, index: int, connection: NodeConnection, python: str, tag: str,
              config: dict, events: queue.Queue[Event]) -> NodeSession:
        channel = connection.start_agent(python, tag)
        session = cls(index, connection, channel, events)
        channel.write(length_prefixed(agent_source()) +
                      length_prefixed(json.dumps(config).encode()))
        session.thread.start()
        return session

    def send(self, command: str) -> None:
        with self.lock:
            self.channel.write(command.encode() + b"\n")

    def _read(self) -> None:
        parser = FrameParser()
        try:
            while True:
                data = self.channel.read(1 << 20)
                if not data:
                    break
                for kind, fields, payload in parser.feed(data):
                    self.events.put(Event(self.index, kind, fields, payload))
        except (OSError, EOFError, ValueError) as exc:
            self.events.put(Event(self.index, "EOF", (), f"{exc}\n".encode()))
            return
        self.events.put(Event(self.index, "EOF", (), self.channel.errors().encode()))

    def close(self) -> None:
        self.channel.close()
