"""The controller's one reader of many agent channels (orchestrator.backends.readers): every
node's frames arrive in order without a thread per node, a channel's end says what the agent
printed on stderr, an agent that finished its step is read no more (its channel waits idle
for the next step), and a descriptor number a closed channel leaves is read again for the
next channel that gets it. The channels are real local ones (LocalChannel) around small
programs standing in for the agent."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

from orchestrator.agent.protocol import Frame, frame
from orchestrator.backends import readers
from orchestrator.backends.base import IdleAgent
from orchestrator.backends.local import LocalChannel, LocalConnection
from orchestrator.backends.readers import READERS
from orchestrator.backends.sessions import CHANNEL_CLOSED, Event, NodeSession, take_idle_agent
from tests.factories import wait_for


def program_channel(code: str) -> LocalChannel:
    """A local channel whose "agent" is `code`."""
    channel = LocalChannel.__new__(LocalChannel)
    channel.proc = subprocess.Popen(
        [sys.executable, "-I", "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
    )
    return channel


def session_on(index: int, channel: LocalChannel, events: queue.Queue[Event]) -> NodeSession:
    session = NodeSession(
        index, LocalConnection(f"n{index}"), channel, events, set_aside=frozenset()
    )
    session.begin_reading()
    return session


def events_until(events: queue.Queue[Event], count: int) -> list[Event]:
    return [events.get(timeout=20) for _ in range(count)]


def reader_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.endswith("-reader")]


def test_many_nodes_frames_in_order_on_one_thread() -> None:
    lines = 50
    code = (
        "import sys\n"
        f"for i in range({lines}):\n"
        "    sys.stdout.buffer.write(b'O 0 %d\\n' % len(b'line %d\\n' % i) + b'line %d\\n' % i)\n"
        "    sys.stdout.flush()\n"
        "sys.stdin.read()\n"
    )
    events: queue.Queue[Event] = queue.Queue()
    sessions = [session_on(i, program_channel(code), events) for i in range(20)]
    try:
        got = events_until(events, 20 * lines)
        assert reader_threads() == []  # none of the 20 has a thread of its own
        for session in sessions:
            mine = [e.data for e in got if e.node == session.index]
            assert mine == [b"line %d\n" % i for i in range(lines)]
            assert all(e.kind == Frame.RANK_OUTPUT for e in got)
    finally:
        for session in sessions:
            session.close()
    assert events.empty() or all(e.kind == CHANNEL_CLOSED for e in list(events.queue))


def test_an_agent_that_ends_says_what_it_printed_on_stderr() -> None:
    code = "import sys\nsys.stderr.write('cannot import orchestrator\\n')\nsys.exit(1)\n"
    events: queue.Queue[Event] = queue.Queue()
    session = session_on(0, program_channel(code), events)
    (event,) = events_until(events, 1)
    assert event.kind == CHANNEL_CLOSED
    assert event.data == b"cannot import orchestrator\n"
    assert not session.reading
    wait_for(lambda: session.fd not in READERS.reading, 5, "the reader let the channel go")
    session.close()


def test_an_agent_that_finished_waits_idle_and_is_read_no_more() -> None:
    finished = frame(Frame.FINISHED).decode()
    code = (
        "import sys\n"
        f"sys.stdout.write({finished!r})\n"
        "sys.stdout.flush()\n"
        "sys.stdin.readline()\n"
        "sys.stdout.write('H 1.0 0 0\\n')\n"
        "sys.stdout.flush()\n"
        "sys.stdin.read()\n"
    )
    events: queue.Queue[Event] = queue.Queue()
    channel = program_channel(code)
    session = session_on(0, channel, events)
    (event,) = events_until(events, 1)
    assert event.kind == Frame.FINISHED
    session.close()
    idle = session.connection.idle_agent
    assert isinstance(idle, IdleAgent) and idle.channel is channel
    assert session.fd not in READERS.reading  # the next step's session reads it
    # The next step: its session reads what the agent says from now on, the old one nothing.
    assert take_idle_agent(session.connection, "", "") is channel
    nxt = session_on(0, channel, events)
    channel.write(b"go\n")
    (event,) = events_until(events, 1)
    assert event.kind == Frame.HEARTBEAT
    assert READERS.reading[nxt.fd] is nxt
    nxt.close()  # not finished: closing its channel ends the agent, and it is read no more
    assert channel.proc.poll() is not None
    assert nxt.fd not in READERS.reading


class Counting:
    """A session as the reader sees it: counts its wake-ups, reads what waits."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.woken = threading.Event()

    def read_here(self) -> bool:
        os.read(self.fd, 4096)
        self.woken.set()
        return True


def test_a_descriptor_number_reused_by_the_next_channel_is_read() -> None:
    old_read, old_write = os.pipe()
    old = Counting(old_read)
    READERS.add(old_read, old)
    # Closed behind the reader's back: the kernel drops it from the set, and the reader
    # still holds that number for the old session until it is told.
    os.close(old_read)
    new_read, new_write = os.pipe()
    try:
        assert new_read == old_read, "the lowest free number comes back"
        new = Counting(new_read)
        READERS.add(new_read, new)
        os.write(new_write, b"x")
        assert new.woken.wait(10)
        assert not old.woken.is_set()
        READERS.remove(old_read, old)  # the old claim on that number leaves the new one be
        assert READERS.reading[new_read] is new
        READERS.remove(new_read, new)
        assert new_read not in READERS.reading
    finally:
        for fd in (old_write, new_read, new_write):
            os.close(fd)


def test_a_full_queue_of_an_attempt_that_is_over_does_not_hold_the_reader() -> None:
    code = (
        "import sys\n"
        "for i in range(5):\n"
        "    sys.stdout.write('H 1.0 0 0\\n')\n"
        "    sys.stdout.flush()\n"
        "sys.stdin.read()\n"
    )
    full: queue.Queue[Event] = queue.Queue(maxsize=1)  # nobody takes from it
    over = session_on(0, program_channel(code), full)
    wait_for(full.full, 10, "the old attempt's queue full")
    over.close()  # that attempt is over: its reader must not wait on that queue for good
    events: queue.Queue[Event] = queue.Queue()
    nxt = session_on(1, program_channel(code), events)
    got = events_until(events, 5)
    assert {(e.node, e.kind) for e in got} == {(1, Frame.HEARTBEAT)}
    nxt.close()


class PipeSession:
    """A session whose channel is a pipe: each read notes the round it came in."""

    def __init__(self, name: str, rounds: list[list[str]], came: threading.Event) -> None:
        self.name, self.rounds, self.came = name, rounds, came
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)

    def read_here(self) -> bool:
        os.read(self.read_fd, 4096)
        self.rounds[-1].append(self.name)
        self.came.set()
        return True


def test_what_comes_on_many_channels_within_the_gap_is_read_in_one_round(monkeypatch) -> None:
    monkeypatch.setattr(readers, "READ_GAP_S", 0.3)  # long enough for this test's writes
    rounds: list[list[str]] = [[]]
    came = threading.Event()
    own = readers.Readers()
    sessions = [PipeSession(name, rounds, came) for name in "abc"]
    real_sleep = time.sleep

    def between_rounds(seconds: float) -> None:
        real_sleep(seconds)
        rounds.append([])

    monkeypatch.setattr(
        readers, "time", SimpleNamespace(monotonic=time.monotonic, sleep=between_rounds)
    )
    for session in sessions:
        own.add(session.read_fd, session)
    os.write(sessions[0].write_fd, b"x")
    assert came.wait(10)
    os.write(sessions[1].write_fd, b"y")  # while the reader waits out its gap
    os.write(sessions[2].write_fd, b"z")
    wait_for(lambda: sum(map(len, rounds)) == 3)
    assert [sorted(r) for r in rounds if r] == [["a"], ["b", "c"]], rounds
    for session in sessions:
        own.remove(session.read_fd, session)
        os.close(session.write_fd)
        os.close(session.read_fd)
