"""Node times put into the controller's clock: NTP's four timestamps, the best of recent
exchanges, and the bracket a node's start gives before any."""

from __future__ import annotations

import pytest

from orchestrator.supervise.clocks import NodeClock


def exchange(clock: NodeClock, skew: float, sent: float, there: float, back: float) -> None:
    """One heartbeat round trip: `there` and `back` seconds each way, the node replying
    0.4 s after it read the controller's heartbeat; the node's clock is `skew` ahead."""
    t1 = sent
    t2 = sent + there + skew
    t3 = t2 + 0.4
    t4 = t3 - skew + back
    clock.exchange(t1, t2, t3, t4)


@pytest.mark.parametrize("skew", [-30.0, -1.0, -0.05, 0.0, 0.3, 30.0])
def test_a_symmetric_exchange_measures_the_skew_exactly(skew: float) -> None:
    clock = NodeClock()
    exchange(clock, skew, 1000.0, 0.002, 0.002)
    assert clock.to_controller(2000.0 + skew) == pytest.approx(2000.0, abs=1e-9)
    assert clock.best().error == pytest.approx(0.002)


def test_the_exchange_with_the_least_delay_wins() -> None:
    clock = NodeClock()
    exchange(clock, -1.0, 1000.0, 0.9, 0.01)  # a slow, lopsided trip: offset off by 0.45 s
    assert abs(clock.to_controller(999.0) - 1000.0) > 0.4
    exchange(clock, -1.0, 1001.0, 0.001, 0.001)
    assert clock.to_controller(999.0) == pytest.approx(1000.0, abs=1e-6)
    assert clock.best().error == pytest.approx(0.001)
    assert clock.describe() == "-1000.0 ms (+/- 1.0 ms)"


def test_asymmetry_stays_within_the_error_bound() -> None:
    clock = NodeClock()
    exchange(clock, 5.0, 1000.0, 0.030, 0.002)
    best = clock.best()
    assert abs(best.offset - 5.0) <= best.error


def test_before_any_exchange_the_start_brackets_the_offset_and_nothing_is_identity() -> None:
    clock = NodeClock()
    assert clock.to_controller(123.0) == 123.0 and clock.describe() is None
    clock.bracket(1000.0, 970.05, 1000.1)  # the node's clock 30 s behind
    assert clock.to_controller(970.05) == pytest.approx(1000.05)
    assert clock.best().error == pytest.approx(0.05)


def test_a_negative_delay_is_not_a_sample() -> None:
    clock = NodeClock()
    clock.exchange(1000.0, 1000.0, 1000.5, 1000.1)  # the node took longer than the trip
    assert clock.best() is None
