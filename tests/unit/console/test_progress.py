"""The start's progress line: live on a terminal, rare elsewhere, silent for a quick step."""

from __future__ import annotations

import io
import threading

from orchestrator.console.progress import CLEAR, LONGEST_GAP_S, QUIET_S, Progress
from tests.factories import FakeClock


def test_on_a_terminal_one_line_is_redrawn_and_cleared_at_the_end() -> None:
    out, clock = io.BytesIO(), FakeClock()
    progress = Progress(out, tty=True, clock=clock)
    progress.begin("probing", 3)
    clock.now += 1
    progress.tick()
    clock.now += 0.01  # too soon to redraw
    progress.tick(ok=False)
    clock.now += 1
    progress.tick()
    progress.end()
    drawn = out.getvalue()
    assert drawn.split(CLEAR)[1:] == [
        b"[orchestrator] probing: 1/3 nodes",
        b"[orchestrator] probing: 3/3 nodes, 1 failed",
        b"",
    ]
    assert b"\n" not in drawn


def test_elsewhere_a_quick_step_says_nothing_and_a_slow_one_a_line_now_and_then() -> None:
    out, clock = io.BytesIO(), FakeClock()
    progress = Progress(out, tty=False, clock=clock)
    progress.begin("connecting", 4)
    clock.now += 1
    progress.tick()
    progress.tick()
    progress.tick()
    progress.tick()
    progress.end()
    assert out.getvalue() == b""  # done within QUIET_S
    progress.begin("starting", 1000)
    for step in range(1, 1000):
        clock.now += 0.02  # 20 s in all
        progress.count(step, failed=step // 500)
    progress.end()
    lines = out.getvalue().decode().splitlines()
    assert len(lines) == 2, lines  # after QUIET_S, then after twice that again
    first, second = (int(line.split(": ")[1].split("/")[0]) for line in lines)
    assert abs(first - QUIET_S / 0.02) <= 1 and lines[0].endswith("/1000 nodes"), lines
    assert abs(second - 3 * QUIET_S / 0.02) <= 2 and lines[1].endswith(" nodes, 1 failed")


def test_elsewhere_a_start_of_many_minutes_says_so_a_few_times_not_every_few_seconds() -> None:
    out, clock = io.BytesIO(), FakeClock()
    progress = Progress(out, tty=False, clock=clock)
    progress.begin("probing", 100_000)
    for step in range(1, 6001):  # ten minutes, a node every 0.1 s
        clock.now += 0.1
        progress.count(step)
    progress.end()
    lines = out.getvalue().decode().splitlines()
    shown_at = [int(line.split(": ")[1].split("/")[0]) / 10 for line in lines]
    gaps = [b - a for a, b in zip([0.0, *shown_at], shown_at, strict=False)]
    expected = [5, 10, 20, 40] + [LONGEST_GAP_S] * 8  # gaps double, up to a minute
    assert len(gaps) == len(expected), shown_at
    assert all(abs(gap - want) <= 0.2 for gap, want in zip(gaps, expected, strict=True)), gaps


def test_counts_from_many_threads_add_up_and_a_closed_terminal_is_ignored() -> None:
    out = io.BytesIO()
    progress = Progress(out, tty=True)
    progress.begin("connecting", 800)
    threads = [
        threading.Thread(target=lambda: [progress.tick() for _ in range(100)]) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert progress.done == 800
    out.close()
    progress.tick()  # writing to a closed stream: no exception
    progress.end()
    assert Progress(None, tty=True).line() == "[orchestrator] : 0/0 nodes"
