"""One srun step carries every node's agent stream (orchestrator.slurm.following.agents and
the dial it runs on each node, orchestrator.agent.dial): here srun is this machine's stand-in
(tests/lab/local_srun.py, a task per "node" with its whole stdin and its stdout merged by
lines, as srun's), and each node's keeper a socket that speaks the keeper's side. The step
over real SLURM runs in the tests/cluster SLURM tests."""

from __future__ import annotations

import os
import queue
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.agent.relay import socket_path
from orchestrator.backends.sessions import CHANNEL_CLOSED, Event
from orchestrator.options.supervision import Supervision
from orchestrator.record.runs import RunRecord
from orchestrator.slurm.following.agents import AllocationStep, leave_steps, step_argv
from orchestrator.slurm.following.handover import Bookmarks
from orchestrator.slurm.following.node_agents import NodeAgents
from tests.factories import hear_agents, supervisor, wait_for
from tests.lab.local_srun import on_path
from tests.unit.slurm.test_slurm_node_agents import Judge

JOB = 990000 + os.getpid() % 9000  # a job id of this test's own: its sockets' folder


class Keeper:
    """Node `index`'s keeper as the dial meets it: answers `from OFFSET` with `at OFFSET 0`,
    then sends what it is told to; keeps what the launcher sent it."""

    def __init__(self, index: int) -> None:
        self.path = socket_path(JOB, 0, index)
        Path(self.path).parent.mkdir(mode=0o700, exist_ok=True)
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(self.path)
        self.server.listen()
        self.conn: socket.socket | None = None
        self.conns: list[socket.socket] = []  # every dial's, closed with it
        self.offsets: list[int] = []  # each dial's `from`
        self.got = bytearray()  # what the launcher sent the agent
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            hello = b""
            while not hello.endswith(b"\n"):
                hello += conn.recv(1)
            offset = int(hello.split()[1])
            self.offsets.append(offset)
            conn.sendall(b"at %d 0\n" % offset)
            self.conn = conn
            self.conns.append(conn)
            threading.Thread(target=self._take, args=(conn,), daemon=True).start()

    def _take(self, conn: socket.socket) -> None:
        while data := conn.recv(1 << 16):
            self.got += data

    def say(self, data: bytes) -> None:
        wait_for(lambda: self.conn is not None, 10, "the dial connected", poll=0.01)
        self.conn.sendall(data)  # type: ignore[union-attr]

    def hang_up(self) -> None:
        conn, self.conn = self.conn, None
        conn.shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]

    def close(self) -> None:
        self.server.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def keepers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Keeper]]:
    monkeypatch.setenv("PATH", f"{on_path(tmp_path / 'bin')}:{os.environ['PATH']}")
    made = [Keeper(index) for index in range(3)]
    yield made
    for keeper in made:
        keeper.close()
    for keeper in made:
        Path(keeper.path).unlink(missing_ok=True)


def next_event(events: queue.Queue[Event]) -> Event:
    return events.get(timeout=20)


def test_one_step_carries_every_nodes_stream_and_each_its_own_commands(keepers) -> None:
    events: queue.Queue[Event] = queue.Queue()
    hosts = {0: "n0", 1: "n1", 2: "n2"}
    step = AllocationStep(JOB, 0, hosts, "python3", events, {0: 0, 1: 4096, 2: 0})
    try:
        payload = bytes(range(256)) * 9  # any bytes, newlines among them, past a record
        keepers[1].say(b"O 0 %d\n" % len(payload) + payload)
        keepers[0].say(b"H 1.0 0 0\n")
        got = sorted([next_event(events), next_event(events)], key=lambda e: e.node)
        assert [(e.node, e.kind) for e in got] == [(0, "H"), (1, "O")]
        assert got[1].data == payload and got[1].fields == ("0",)
        assert keepers[1].offsets == [4096] and step.sessions[1].channel.start == 4096
        step.sessions[2].send("stacks 1 signal")  # to node 2's agent only
        wait_for(lambda: keepers[2].got == b"stacks 1 signal\n", 10, "node 2 got it", poll=0.01)
        assert keepers[0].got == keepers[1].got == b""
    finally:
        leave_steps([step])


def test_a_nodes_dial_ending_closes_only_its_session_and_is_dialled_again(keepers) -> None:
    events: queue.Queue[Event] = queue.Queue()
    step = AllocationStep(JOB, 0, {0: "n0", 1: "n1", 2: "n2"}, "python3", events, {})
    try:
        for keeper in keepers:
            keeper.say(b"H 1.0 0 0\n")
        assert sorted(next_event(events).node for _ in keepers) == [0, 1, 2]
        keepers[1].hang_up()
        closed = next_event(events)
        assert (closed.node, closed.kind) == (1, CHANNEL_CLOSED)
        assert b"closed its end" in closed.data
        assert not step.sessions[1].reading and step.sessions[0].reading
        again = step.redial(1, "n1", 250)  # the same step's task dials it again
        assert step.sessions[1] is again and again.reading
        wait_for(lambda: keepers[1].offsets == [0, 250], 10, "dialled again", poll=0.01)
        keepers[1].say(b"H 2.0 0 0\n")
        event = next_event(events)
        assert (event.node, event.kind, event.fields[0]) == (1, "H", "2.0")
    finally:
        leave_steps([step])


def test_the_steps_end_closes_every_session_still_open(keepers) -> None:
    events: queue.Queue[Event] = queue.Queue()
    step = AllocationStep(JOB, 0, {0: "n0", 1: "n1"}, "python3", events, {})
    keepers[0].say(b"X 0 1.0\n")  # node 0's agent finished: nothing follows from it
    assert next_event(events).kind == "X"
    leave_steps([step])
    closed = next_event(events)
    assert (closed.node, closed.kind) == (1, CHANNEL_CLOSED)
    assert events.empty() and step.ended()
    late = step.redial(1, "n1", 0)  # the step has ended: closed at once, to be dialled anew
    assert not late.reading and next_event(events).kind == CHANNEL_CLOSED


def test_the_step_is_one_srun_over_every_node_with_every_task_given_all_input() -> None:
    argv = step_argv(7, 2, ["node1", "node2", "node3"], "python3")
    assert argv[:3] == ["srun", "--overlap", "--jobid=7"]
    assert "--nodelist=node[1-3]" in argv and "--ntasks-per-node=1" in argv
    assert "--input=all" in argv and "--unbuffered" not in argv
    assert argv[-2:] == [socket_path(7, 2, "{}"), "120"]


def test_a_step_that_ends_is_told_once_and_its_nodes_dialled_again_in_one_new_step(
    keepers, tmp_path: Path
) -> None:
    """srun killed under a running job: one note for the step, not one per node, and one
    new step for every node, each from where its stream was handled."""
    events: queue.Queue = queue.Queue()
    agents = NodeAgents(
        JOB, 0, "python3", Bookmarks(RunRecord.create(tmp_path, "r1"), None), events
    )
    sup = supervisor(
        tmp_path / "logs",
        ("n0", "n1"),
        1,
        sessions=agents.sessions,
        events=events,
        label="{host} r{rank}",
        supervision=Supervision(hang_timeout=0),
    )
    agents.reach(["n0", "n1"], None)
    try:
        for keeper in keepers[:2]:
            keeper.say(b"H 1.0 0 0\n")
        wait_for(lambda: events.qsize() >= 2, 20, "both heartbeats", poll=0.01)
        hear_agents(agents, sup, Judge(), running=True)
        first = agents.steps[0]
        first.channel.proc.kill()  # type: ignore[union-attr]
        wait_for(lambda: events.qsize() >= 2, 20, "both channels closed", poll=0.01)
        hear_agents(agents, sup, Judge(), running=True)  # told, then dialled again
        sup.sink.flush()
        told = (tmp_path / "logs" / "combined.log").read_text()
        assert told.count("the step to the node agents ended") == 1, told
        assert "its agent's channel closed" not in told
        assert len(agents.steps) == 2 and agents.step_of == {0: agents.steps[1], 1: agents.steps[1]}
        handled = [agents.bookmarks.agents[str(i)] for i in range(2)]
        assert handled == [10, 10]  # each heartbeat's 10 bytes
        for keeper in keepers[:2]:  # each task dials on its own: in either order
            wait_for(lambda k=keeper: k.offsets == [0, 10], 20, "dialled again", poll=0.01)
    finally:
        agents.leave()
        sup.sink.close()
