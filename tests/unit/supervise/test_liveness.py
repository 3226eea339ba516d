"""Lost means gone, not busy (supervise/liveness.py), on a fake clock: a silent agent on a
node whose sshd answers is waited for; one whose sshd does not is lost within the heartbeat
timeout; a controller that was itself away does not count that time against anyone."""

from __future__ import annotations

import threading

import pytest

from orchestrator.supervise import liveness
from orchestrator.supervise.liveness import Liveness
from orchestrator.supervise.state import NodeState
from tests.factories import FakeClock


class Session:
    """A node's session: `heard` moves when its agent speaks; its sshd answers or not."""

    def __init__(
        self, index: int, clock: FakeClock, sshd_up: bool = True, kernel_up: bool | None = None
    ) -> None:
        self.index = index
        self.clock = clock
        self.heard = clock.now
        self.sshd_up = sshd_up
        self.kernel_up = sshd_up if kernel_up is None else kernel_up  # TCP acknowledgements
        self.asked = 0

    def speak(self) -> None:
        self.heard = self.clock.now

    def answers(self) -> bool:
        self.asked += 1
        if not self.sshd_up:
            threading.Event().wait()  # a dead link: the keepalive never comes back
        return True

    def acknowledged(self, within: float) -> bool | None:
        return self.kernel_up


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock(1000.0)
    monkeypatch.setattr(liveness.time, "monotonic", fake.monotonic)
    monkeypatch.setattr(liveness.threading, "Thread", InlineThread)
    return fake


REAL_THREAD = threading.Thread


class InlineThread:
    """A keepalive answers before the loop goes on (or never: its thread stays blocked)."""

    def __init__(self, target, name: str, daemon: bool) -> None:
        self.target = target

    def start(self) -> None:
        thread = REAL_THREAD(target=self.target, daemon=True)
        thread.start()
        thread.join(0.2)


def run(live: Liveness, clock: FakeClock, seconds: float, *, overdue=lambda slack: False,
        speaking=()):  # fmt: skip
    """Advance `seconds` in loop passes of 0.1 s; returns what was found lost."""
    lost = []
    for _ in range(int(seconds * 10)):
        clock.now += 0.1
        for session in speaking:
            session.speak()
        live.tick()
        found = live.check(overdue)
        for node, _, _ in found:
            node.done = True  # as the detector records it
        lost += found
    return lost


def setup(clock: FakeClock, *sshd_up: bool, hb: float = 30, stall: float = 600):
    nodes = [NodeState(i, f"n{i}") for i in range(len(sshd_up))]
    sessions = [Session(i, clock, up) for i, up in enumerate(sshd_up)]
    notes: list[str] = []
    return Liveness(nodes, sessions, notes.append, hb, stall), sessions, notes


def test_a_node_whose_sshd_answers_is_busy_not_lost_until_the_stall_timeout(clock) -> None:
    live, (busy, talking), notes = setup(clock, True, True, hb=30, stall=120)
    assert run(live, clock, 100, speaking=[talking]) == []
    assert busy.asked >= 3
    assert notes == [
        "n0: its agent has been silent for 30 s, but the node answers: busy, so "
        "waiting up to 120 s (--stall-timeout)"
    ]
    busy.speak()
    assert run(live, clock, 1, speaking=[talking]) == []
    assert notes[-1] == "n0: its agent is heard again"
    lost = run(live, clock, 125, speaking=[talking])
    assert [(node.host, gone) for node, _, gone in lost] == [("n0", False)]
    assert "frozen or stuck" in lost[0][1]


def test_a_node_whose_sshd_does_not_answer_is_lost_within_the_heartbeat_timeout(clock) -> None:
    live, (dead, talking), _ = setup(clock, False, True, hb=5)
    lost = run(live, clock, 5.6, speaking=[talking])
    assert [(node.host, gone) for node, _, gone in lost] == [("n0", True)]
    assert "no answer from its sshd" in lost[0][1]


def test_a_node_whose_kernel_acknowledges_but_sshd_does_not_answer_is_busy_not_lost(clock) -> None:
    # Seen at 250 nodes on a machine swapping hard: every sshd too starved to answer a
    # keepalive within the heartbeat timeout, every node's kernel acknowledging our packets.
    live, (starved,), notes = setup(clock, False, hb=5, stall=60)
    starved.kernel_up = True
    assert run(live, clock, 30) == []
    assert notes == [
        "n0: its agent has been silent for 5 s, but its kernel acknowledges every packet (its "
        "sshd is too starved to answer): busy, so waiting up to 60 s (--stall-timeout)"
    ]
    lost = run(live, clock, 31)
    assert [(node.host, gone) for node, _, gone in lost] == [("n0", False)]
    assert "frozen or stuck" in lost[0][1] and "kernel acknowledges" in lost[0][1]


def test_a_node_whose_kernel_cannot_be_asked_counts_as_not_acknowledging(clock) -> None:
    live, (hidden,), _ = setup(clock, False, hb=5)
    hidden.kernel_up = None  # through a jump host: the acknowledgements are the hop's
    lost = run(live, clock, 5.6)
    assert [(node.host, gone) for node, _, gone in lost] == [("n0", True)]


def test_time_the_controller_was_away_is_not_counted(clock) -> None:
    live, (node,), _ = setup(clock, False, hb=5)
    run(live, clock, 2)
    clock.now += 60  # the controller was stopped (SIGSTOP) or starved for a minute
    node.speak()  # and on waking finds the agent's heartbeats waiting
    live.tick()
    assert live.check(lambda slack: False) == []
    assert run(live, clock, 3, speaking=[node]) == []


def test_a_loop_behind_its_events_does_not_count_silence(clock) -> None:
    live, (node,), _ = setup(clock, False, hb=5)
    for _ in range(100):
        clock.now += 0.1
        live.tick(behind=True)
        assert live.check(lambda slack: False) == []


def test_after_the_stop_a_gone_node_is_lost_and_an_answering_one_gets_more_time(clock) -> None:
    live, (gone, slow), _ = setup(clock, False, True, hb=6)
    stop_overdue_at = clock.now + 2

    def overdue(slack: float) -> bool:
        return clock.now - slack > stop_overdue_at

    lost = run(live, clock, 4.6, overdue=overdue)  # its keepalive went out at 2 s
    assert [(node.host, gone) for node, _, gone in lost] == [("n0", True)]
    lost = run(live, clock, 6, overdue=overdue)
    assert [(node.host, gone) for node, _, gone in lost] == [("n1", False)]
    assert "the node answers" in lost[0][1]


def test_after_the_stop_a_node_whose_kernel_acknowledges_gets_more_time(clock) -> None:
    live, (gone, starved), _ = setup(clock, False, False, hb=6)
    starved.kernel_up = True
    stop_overdue_at = clock.now + 2

    def overdue(slack: float) -> bool:
        return clock.now - slack > stop_overdue_at

    lost = run(live, clock, 4.6, overdue=overdue)
    assert [(node.host, gone) for node, _, gone in lost] == [("n0", True)]
    lost = run(live, clock, 6, overdue=overdue)
    assert [(node.host, gone) for node, _, gone in lost] == [("n1", False)]


def test_no_heartbeat_timeout_means_no_verdicts(clock) -> None:
    live, _, _ = setup(clock, False, hb=0)
    assert run(live, clock, 50) == []


@pytest.mark.parametrize("hb", [1.5, 3, 5, 30, 60, 120])
def test_steady_beats_come_before_a_node_is_asked_and_two_before_an_agent_asks(hb) -> None:
    """The beat schedules (agent/protocol.py) against the silences that start questions:
    an agent's beat is late before the controller asks the node's sshd, and an agent hears
    two of the controller's beats within the timeout after which it asks the controller's
    host (agent/main.py check_controller)."""
    from itertools import islice

    from orchestrator.agent.protocol import AGENT_BEATS, CONTROLLER_BEATS, beat_intervals

    agent = list(islice(beat_intervals(hb, AGENT_BEATS), 20))
    controller = list(islice(beat_intervals(hb, CONTROLLER_BEATS), 20))
    assert max(agent) <= hb * liveness.ASK_AFTER * 2 / 3  # late by a third of the wait, at least
    assert 2 * max(controller) <= hb
    assert agent[-1] <= controller[-1]  # nodes speak at least as often as they are spoken to
