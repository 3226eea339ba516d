"""How often the SLURM follower asks squeue and reads the nodes' files
(orchestrator.slurm.following.cadence). The agents here are local processes behind the same channel
and session classes a job's `srun --overlap` steps use; the follower's loop runs against real
SLURM in test_slurm_cluster.py and test_slurm_agents_cluster.py."""

from __future__ import annotations

import queue
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.backends.sessions import CHANNEL_CLOSED, Event, NodeSession
from orchestrator.options.supervision import Supervision
from orchestrator.slurm.following.agents import AllocationNode, SrunChannel
from orchestrator.slurm.following.cadence import (
    AGENTS_POLL_S,
    FILES_IDLE_S,
    FILES_S,
    HEARD_S,
    POLL_S,
    Cadence,
)
from orchestrator.supervise import Supervisor
from tests.factories import supervisor, wait_for

# An agent as its session reads it: a heartbeat for each line it is sent; it ends when its
# stdin closes.
AGENT = "import sys\nfor line in sys.stdin:\n    print('H 1.0 0 0', flush=True)\n"


@pytest.fixture
def sessions() -> Iterator[tuple[list[NodeSession], queue.Queue[Event]]]:
    events: queue.Queue[Event] = queue.Queue()
    started = []
    for index in range(2):
        channel = SrunChannel([sys.executable, "-I", "-c", AGENT])
        session = NodeSession(index, AllocationNode(f"n{index}"), channel, events)  # type: ignore[arg-type]
        session.begin_reading()
        started.append(session)
    yield started, events
    for session in started:
        session.channel.close()


def beat(session: NodeSession) -> None:
    """The agent says something; returns once its reader has it."""
    before = session.heard
    session.channel.write(b"beat\n")
    wait_for(lambda: session.heard != before, 10, f"node {session.index} heard", poll=0.01)


def attempt(tmp_path: Path) -> Supervisor:
    """The follower's supervisor of an attempt on n0 and n1, a rank on each."""
    return supervisor(
        tmp_path / "logs",
        ("n0", "n1"),
        1,
        label="{host} r{rank}",
        supervision=Supervision(grace=0, heartbeat_timeout=0),
        stop_on_failure=False,
    )


def answering(cadence: Cadence, sessions: list[NodeSession]) -> float:
    """Every agent heard from: the time the next squeue is counted from."""
    cadence.reached(sessions)
    for session in sessions:
        beat(session)
    now = time.monotonic()
    assert cadence.answering(now)
    return now


# --- squeue ------------------------------------------------------------------------------


def test_a_queued_job_is_asked_about_every_second() -> None:
    cadence = Cadence()
    assert cadence.squeue_now(100.0, None)
    assert not cadence.squeue_now(100.0 + POLL_S / 2, None)
    assert cadence.squeue_now(100.0 + POLL_S, None)
    assert cadence.pause(100.0 + POLL_S) == FILES_S  # the files' pace: the first pass


def test_agents_not_reached_or_not_heard_yet_keep_the_pace(sessions, tmp_path: Path) -> None:
    started, _ = sessions
    cadence, sup, now = Cadence(), attempt(tmp_path), time.monotonic()
    cadence.reached([])  # not reached (--login)
    assert cadence.squeue_now(now, sup)
    assert cadence.squeue_now(now + POLL_S, sup)
    cadence.reached(started)
    beat(started[0])  # the other has said nothing yet
    assert not cadence.answering(time.monotonic())
    assert cadence.squeue_now(now + 2 * POLL_S, sup)


def test_while_every_agent_answers_squeue_runs_rarely(sessions, tmp_path: Path) -> None:
    started, _ = sessions
    cadence, sup = Cadence(), attempt(tmp_path)
    now = answering(cadence, started)
    assert cadence.squeue_now(now, sup)
    assert not cadence.squeue_now(now + POLL_S, sup)
    assert not cadence.squeue_now(now + AGENTS_POLL_S / 2, sup)
    for session in started:
        beat(session)  # the beats go on
    assert cadence.squeue_now(now + AGENTS_POLL_S, sup)
    # Waiting for the files, not for squeue: the loop's pause is the files'.
    assert cadence.pause(now + AGENTS_POLL_S) == FILES_S


def test_a_closed_channel_asks_at_once_then_every_second(sessions, tmp_path: Path) -> None:
    started, events = sessions
    cadence, sup = Cadence(), attempt(tmp_path)
    now = answering(cadence, started)
    assert cadence.squeue_now(now, sup)
    started[1].channel.hang_up()  # the step ends: the agent's process leaves
    event = events.get(timeout=10)
    while event.kind != CHANNEL_CLOSED:
        event = events.get(timeout=10)
    cadence.channel_closed(event.node)
    assert cadence.squeue_now(now + 0.01, sup)
    assert not cadence.squeue_now(now + 0.01 + POLL_S / 2, sup)
    assert cadence.squeue_now(now + 0.01 + POLL_S, sup)


def test_an_agent_gone_quiet_asks_at_once(sessions, tmp_path: Path) -> None:
    started, _ = sessions
    cadence, sup = Cadence(), attempt(tmp_path)
    now = answering(cadence, started)
    assert cadence.squeue_now(now, sup)
    quiet = min(session.heard for session in started) + HEARD_S
    assert cadence.squeue_now(quiet, sup)
    assert cadence.squeue_now(quiet + POLL_S, sup)


def test_a_stop_or_a_node_ending_asks_at_once(sessions, tmp_path: Path) -> None:
    started, _ = sessions
    cadence, sup = Cadence(), attempt(tmp_path)
    now = answering(cadence, started)
    assert cadence.squeue_now(now, sup)
    sup.node_exited(sup.nodes[0], 0, time.time())
    assert cadence.squeue_now(now + 0.01, sup)
    assert cadence.squeue_now(now + 0.01 + POLL_S, sup)

    cadence, sup = Cadence(), attempt(tmp_path)
    now = answering(cadence, started)
    assert cadence.squeue_now(now, sup)
    sup.begin_stop(0, "test")
    assert cadence.squeue_now(now + 0.01, sup)


def test_an_exit_or_a_warning_asks_at_once(sessions, tmp_path: Path) -> None:
    started, _ = sessions
    cadence, sup = Cadence(), attempt(tmp_path)
    now = answering(cadence, started)
    assert cadence.squeue_now(now, sup)
    cadence.poll_now()
    assert cadence.squeue_now(now + 0.01, sup)
    assert not cadence.squeue_now(now + 0.01 + POLL_S, sup)  # and then rarely again


# --- the files ---------------------------------------------------------------------------


def test_the_files_are_read_less_often_while_nothing_comes() -> None:
    cadence = Cadence()
    assert cadence.files_pause == FILES_S
    pauses = []
    for _ in range(6):
        cadence.files_read(came=False)
        pauses.append(cadence.files_pause)
    assert pauses == pytest.approx([0.2, 0.4, 0.8, FILES_IDLE_S, FILES_IDLE_S, FILES_IDLE_S])
    cadence.files_read(came=True)
    assert cadence.files_pause == FILES_S


def test_the_pause_ends_when_squeue_is_due() -> None:
    cadence = Cadence()
    assert cadence.squeue_now(100.0, None)
    for _ in range(5):
        cadence.files_read(came=False)
    assert cadence.pause(100.0) == pytest.approx(min(FILES_IDLE_S, POLL_S))
    assert cadence.pause(100.0 + 0.7) == pytest.approx(POLL_S - 0.7)
    assert cadence.pause(100.0 + 5) == 0.0
