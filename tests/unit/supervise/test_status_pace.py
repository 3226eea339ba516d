"""StatusPace: changes told at once while telling is cheap; an expensive telling held back
so that it takes at most SHARE of the time, the changes meanwhile told together, the last
always told."""

from __future__ import annotations

import math

from orchestrator.supervise.status_pace import PACED_FROM_S, SHARE, StatusPace


class Clock:
    """A clock that a telling (paced() below) moves on by `cost` seconds."""

    def __init__(self) -> None:
        self.now = 100.0
        self.cost = 0.0

    def __call__(self) -> float:
        return self.now


def paced(clock: Clock) -> tuple[StatusPace, list[float]]:
    told: list[float] = []

    def tell() -> None:
        told.append(clock.now)
        clock.now += clock.cost

    return StatusPace(tell, clock), told


def test_a_cheap_telling_is_never_held_back() -> None:
    clock = Clock()
    clock.cost = PACED_FROM_S / 2
    pace, told = paced(clock)
    for _ in range(5):
        pace.changed()
        assert pace.wait() == 0.0
        pace.tell()
    assert len(told) == 5 and not pace.unsaid and math.isinf(pace.wait())


def test_nothing_changed_is_not_told() -> None:
    clock = Clock()
    pace, told = paced(clock)
    pace.tell()
    pace.tell(force=True)
    assert told == []


def test_an_expensive_telling_takes_at_most_its_share_and_the_changes_meanwhile_come_together() -> (
    None
):
    clock = Clock()
    clock.cost = 0.05  # 50 ms: the status of thousands of ranks
    pace, told = paced(clock)
    pace.changed()
    pace.tell()
    assert told == [100.0]
    gap = clock.cost / SHARE - clock.cost  # 0.45 s: the telling is a tenth of the time
    for _ in range(9):  # changes every 40 ms: held back, the loop told how long to wait
        clock.now += 0.04
        pace.changed()
        pace.tell()
        assert len(told) == 1
        assert math.isclose(pace.wait(), 100.05 + gap - clock.now)
    clock.now = 100.05 + gap
    pace.tell()
    assert told == [100.0, 100.05 + gap] and not pace.unsaid
    # The last word is told however soon it comes.
    clock.now += 0.01
    pace.changed()
    pace.tell()
    assert len(told) == 2
    pace.tell(force=True)
    assert len(told) == 3 and not pace.unsaid
