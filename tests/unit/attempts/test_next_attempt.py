"""What follows an attempt, decided once for every backend (orchestrator.attempts): the
same facts give the same next attempt over SSH and under SLURM."""

from __future__ import annotations

import pytest

from orchestrator.attempts.next_attempt import AttemptEnd, Next, next_attempt


@pytest.mark.parametrize(
    ("end", "expected"),
    [
        (AttemptEnd(4, lost=1, spares_left=1, min_nodes=2), Next.SPARE),  # a spare first
        (AttemptEnd(4, lost=1, spares_left=0, min_nodes=2), Next.SHRINK),  # 3 of 4, floor 2
        (AttemptEnd(3, lost=1, min_nodes=2), Next.SHRINK),  # 2 of 3 left: at the floor goes on
        (AttemptEnd(2, lost=1, min_nodes=2), Next.FLOOR),  # 1 left, floor 2
        (AttemptEnd(4, lost=3, min_nodes=2), Next.FLOOR),  # several at once
        (AttemptEnd(4, lost=1, min_nodes=0), Next.UNREPLACED),  # no --min-nodes (SLURM's 0)
        (AttemptEnd(4, lost=1, min_nodes=None), Next.UNREPLACED),  # no --min-nodes (SSH's)
        (AttemptEnd(3, back=1), Next.GROW),  # stopped at a checkpoint for a node back
        (AttemptEnd(3, lost=1, spares_left=1, back=1), Next.SPARE),  # a fault comes first
        (AttemptEnd(4, resubmit=True), Next.RESUBMIT),  # a time limit, resubmissions left
        (AttemptEnd(4, back=1, resubmit=True), Next.GROW),  # growing is the next job too
        (AttemptEnd(4), Next.END),  # done, failed by itself, stopped
        (AttemptEnd(4, lost=1, spares_left=1, interrupted=True), Next.END),  # Ctrl-C ends it
        (AttemptEnd(4, resubmit=True, interrupted=True), Next.END),
    ],
)
def test_what_follows_an_attempt(end: AttemptEnd, expected: Next) -> None:
    step = next_attempt(end)
    assert step is expected
    assert step.goes_on == (expected in (Next.SPARE, Next.SHRINK, Next.GROW, Next.RESUBMIT))
