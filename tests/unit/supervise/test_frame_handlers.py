"""The supervisor's table of frame handlers against the protocol's frame kinds: every kind
has a handler, and a frame of each kind, encoded as the agent sends it and decoded as the
controller reads it, reaches that handler. What each handler does is in test_supervise.py,
test_metrics.py, test_time_limit.py and test_hangs.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.agent.protocol import WITH_PAYLOAD, Frame, frame
from orchestrator.backends.sessions import CHANNEL_CLOSED, Event, FrameParser
from orchestrator.supervise.frame_handlers import HANDLERS, handle
from tests.factories import supervisor

T = "1700000000.250000"
# One frame of each kind, as the agent's senders write it.
EXAMPLES: dict[Frame, bytes] = {
    Frame.STARTED: frame(Frame.STARTED, 4242, T, "eth0=10.0.0.1"),
    Frame.RANK_OUTPUT: frame(Frame.RANK_OUTPUT, 1, payload=b"step 1\n"),
    Frame.SCRIPT_OUTPUT: frame(Frame.SCRIPT_OUTPUT, 0, payload=b"torchrun\n"),
    Frame.RANK_EXITED: frame(Frame.RANK_EXITED, 1, 0, T, 0),
    Frame.ERROR_FILE: frame(Frame.ERROR_FILE, 1, payload=b'{"message": "boom"}'),
    Frame.MESSAGE: frame(Frame.MESSAGE, payload=b"a note\n"),
    Frame.HEARTBEAT: frame(Frame.HEARTBEAT, T, T, T),
    Frame.FINISHED: frame(Frame.FINISHED, 0, T),
    Frame.DISK_FAULT: frame(Frame.DISK_FAULT, "ENOSPC", T, payload=b"~/runs/x/node0"),
    Frame.METRICS: frame(Frame.METRICS, 1, payload=b'{"step": 1}\n'),
    Frame.NODE_SAMPLE: frame(Frame.NODE_SAMPLE, payload=b'{"cpu_percent": 7}'),
    Frame.STACKS: frame(Frame.STACKS, 3, payload=b"[]"),
    Frame.FLIGHT_DUMP: frame(Frame.FLIGHT_DUMP, 3, 1, "no", payload=b"no dump"),
    Frame.TIME_WARNING: frame(Frame.TIME_WARNING, "USR1", T, "0,1", "-"),
    Frame.NO_ANSWER: frame(Frame.NO_ANSWER, "10.0.0.2", 29500, 6, "store", "torchrun"),
}


def test_the_wire_letters_are_the_protocols() -> None:
    """The names are the controller's; the letters are what agents already on nodes send."""
    assert "".join(kind.value for kind in Frame) == "SONEFMHXWQPKLGU"
    assert {kind.value for kind in WITH_PAYLOAD} == set("ONFMWQPKL")
    assert f"{Frame.FINISHED}" == str(Frame.FINISHED) == "X"


def test_every_frame_kind_has_a_handler_and_an_example() -> None:
    assert set(HANDLERS) == {*Frame, CHANNEL_CLOSED}
    assert set(EXAMPLES) == set(Frame)


@pytest.mark.parametrize("kind", list(Frame), ids=lambda kind: kind.name)
def test_a_decoded_frame_reaches_its_kinds_handler(
    kind: Frame, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reached: list[tuple[str, int, tuple[str, ...]]] = []
    for each in HANDLERS:
        monkeypatch.setitem(
            HANDLERS,
            each,
            lambda run, node, event, each=each: reached.append((each, node.index, event.fields)),
        )
    sup = supervisor(tmp_path, ("a",))
    arrived = time.time()
    (decoded,) = FrameParser().feed(EXAMPLES[kind])
    handle(sup, Event(0, *decoded, at=arrived))
    assert [(handler_kind, node) for handler_kind, node, _ in reached] == [(kind, 0)]
    assert sup.nodes[0].heard_wall >= arrived


def test_a_closed_channel_reaches_its_handler_and_loses_the_node(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, ("a",))
    handle(sup, Event(0, CHANNEL_CLOSED, (), b"Connection reset\n"))
    assert sup.nodes[0].state == "lost" and sup.stopper.reason == "a lost"
    assert sup.nodes[0].detail == "its agent ended without reporting: Connection reset"


def test_a_kind_this_controller_does_not_know_is_only_heard(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, ("a",))
    sup.nodes[0].heard_wall = 0.0
    handle(sup, Event(0, "Z", ("1",), b"", at=123.0))
    assert sup.nodes[0].heard_wall == 123.0 and sup.nodes[0].state == "starting"
