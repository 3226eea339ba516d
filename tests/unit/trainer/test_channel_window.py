"""The metrics channel's window (orchestrator/trainer/channel.py): a record covers what the
trainer's progress lines average over, so `top` reads what the console reads. The loop is
driven here by hand, with made-up losses and a clock of our own; test_trainer_channel.py
runs the real trainer under torchrun."""

from __future__ import annotations

import io
import json
import math

import torch

from orchestrator.trainer.channel import INTERVAL_S, MetricsChannel
from orchestrator.trainer.reporting import reported_at


def drive(
    total: int,
    log_every: int,
    step_s: float,
    stop_at: int | None = None,
    first_due_at: float | None = None,
) -> tuple[list[dict], list[tuple[int, float]]]:
    """Run `total` steps of `step_s` each, as the loop calls the channel: the records
    written, and each progress line's (step, mean loss over its window). Step i's loss
    is i, so a mean names the steps it covers."""
    out = io.StringIO()
    channel = MetricsChannel(out, "metrics.jsonl", samples_per_step=8)
    channel.start(0.0, 0)
    if first_due_at is not None:  # as if the clock had started earlier
        channel.due = first_due_at
    lines, window = [], []
    for step in range(1, total + 1):
        now = step * step_s
        channel.losses.append(torch.tensor(float(step)))
        window.append(step)
        stopped = step == stop_at
        if reported_at(step, log_every, total, stopped):
            lines.append((step, sum(window) / len(window)))
            window = []
        channel.after_step(step, 0.0, log_every=log_every, total_steps=total, stopped=stopped,
                           now=now)  # fmt: skip
        if stopped:
            break
    return [json.loads(line) for line in out.getvalue().splitlines()], lines


def test_a_run_shorter_than_a_second_records_its_last_line_window_not_the_whole_run() -> None:
    # The README's first command: 200 steps of 3 ms, a line every 20.
    records, lines = drive(total=200, log_every=20, step_s=0.003)
    assert len(records) == 1
    (record,) = records
    assert (record["step"], record["steps"]) == (200, 20)
    assert record["loss"] == lines[-1][1] == sum(range(181, 201)) / 20
    assert math.isclose(record["step_s"], 0.003)
    assert math.isclose(record["samples_per_s"], 8 / 0.003)


def test_with_frequent_lines_each_record_is_one_line_window() -> None:
    # A line every 20 steps of 10 ms (0.2 s): a record falls due between two lines and
    # waits for the next, then covers that line's steps exactly.
    records, lines = drive(total=2000, log_every=20, step_s=0.01)
    by_step = dict(lines)
    assert len(records) >= 15
    for record in records:
        assert record["step"] % 20 == 0 and record["steps"] == 20, record
        assert record["loss"] == by_step[record["step"]]
    steps = [r["step"] for r in records]
    gaps = [(b - a) * 0.01 for a, b in zip(steps, steps[1:], strict=False)]
    assert all(INTERVAL_S <= gap <= 2 * INTERVAL_S for gap in gaps), gaps


def test_with_lines_far_apart_a_record_covers_the_last_second() -> None:
    # A line every 500 steps of 10 ms (5 s): records each second in between, and the one
    # after a line covers only the steps since that line.
    records, _ = drive(total=1200, log_every=500, step_s=0.01)
    assert [(r["step"], r["steps"]) for r in records] == [
        (100, 100), (200, 100), (300, 100), (400, 100), (500, 100),
        (600, 100), (700, 100), (800, 100), (900, 100), (1000, 100),
        (1100, 100), (1200, 100),
    ]  # fmt: skip
    # Due at step 1050, with the line at 1000 in between: the record covers 1001-1050.
    records, _ = drive(total=1200, log_every=500, step_s=0.01, first_due_at=0.5)
    assert [(r["step"], r["steps"]) for r in records][:7] == [
        (50, 50), (150, 100), (250, 100), (350, 100), (450, 100), (550, 50), (650, 100),
    ]  # fmt: skip


def test_a_stop_records_its_step_at_once() -> None:
    records, lines = drive(total=1000, log_every=100, step_s=0.003, stop_at=250)
    assert lines[-1][0] == 250 and records[-1]["step"] == 250
    assert records[-1]["steps"] == 50 and records[-1]["loss"] == lines[-1][1]


def test_no_step_is_counted_twice_and_records_stay_a_second_apart() -> None:
    for log_every, step_s in ((7, 0.004), (20, 0.01), (500, 0.01), (1, 0.3)):
        records, _ = drive(total=900, log_every=log_every, step_s=step_s)
        before, when = 0, -INTERVAL_S
        for record in records[:-1]:
            assert record["step"] - record["steps"] >= before, (log_every, record)
            now = record["step"] * step_s
            assert now - when >= INTERVAL_S - 1e-9, (log_every, records)
            before, when = record["step"], now
