"""The line a rank that ended on the warning signal is named by, and the run's stop reason,
say what the warning was for: the time limit, a preemption, or growing back at a checkpoint.
One source words it (WarningClock.the_warning); the detector says it for SSH and SLURM runs
alike, and the SLURM follower tells the clock when SLURM's signal was for a preemption."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from orchestrator.slurm.following.follow import Follower
from orchestrator.slurm.recovery.job_attempts import JobAttempts
from orchestrator.supervise.detect import Detector
from orchestrator.supervise.stopping import Stopper
from orchestrator.supervise.time_limit import Cause, WarningClock
from tests.factories import FakeSession, Notes, world
from tests.unit.slurm.test_slurm_spares import FakeCommands
from tests.unit.supervise.test_time_limit import FakeRun

LIMIT = "the time limit's warning"
PREEMPTION = "the preemption's warning"
GROWING = "the warning for growing to 4 nodes at a checkpoint"


def warned_detector(cause: str) -> tuple[Detector, Notes]:
    """Two nodes of two ranks each, warned for `cause`; ranks 2 and 3 do not catch it."""
    nodes, ranks = world()
    notes = Notes()
    det = Detector(nodes, ranks, notes, Stopper(nodes, [FakeSession(0), FakeSession(1)], notes, 3))
    t0 = det.started_wall
    if cause == "limit":
        det.warning = WarningClock(40, ("USR1", 10), t0)
        det.warning.tick(FakeRun({0, 1, 2, 3}), Notes(), t0 + 30)
    else:
        det.warning = WarningClock(None, None, t0)  # over SSH without --time; under SLURM
        det.warning.checkpoint(FakeRun({0, 1, 2, 3}), Notes(), t0, "growing to 4 nodes")
        if cause == "preemption":
            det.warning.warned_for(Cause.PREEMPTION)
    det.warning.not_catching = {2, 3}
    return det, notes


@pytest.mark.parametrize(
    ("cause", "words"), [("limit", LIMIT), ("preemption", PREEMPTION), ("growing", GROWING)]
)
def test_the_ended_line_and_the_stop_reason_say_what_the_warning_was_for(
    cause: str, words: str
) -> None:
    det, notes = warned_detector(cause)
    t = det.started_wall + 31
    assert det.rank_exited(0, 138, t, after_stop=False, warned=True) is None  # rank 1 saves
    reason = det.rank_exited(1, 138, t + 1, after_stop=False, warned=True)
    assert reason == f"rank 1 on a ended on {words}"
    assert notes.notes[:2] == [
        f"rank 0 on a ended with signal SIGUSR1 (exit code 138) after {words}",
        f"rank 1 on a ended with signal SIGUSR1 (exit code 138) after {words}",
    ]
    assert det.warning is not None and det.warning.ended_summary(det.ranks, False).startswith(
        f"stopped on {words} (SIGUSR1"
    )


def test_no_line_says_time_limit_for_a_warning_with_no_limit_behind_it() -> None:
    for cause in ("preemption", "growing"):
        det, notes = warned_detector(cause)
        det.rank_exited(0, 138, det.started_wall + 1, after_stop=False, warned=True)
        assert det.warning is not None
        assert "time limit" not in notes.notes[0] + det.warning.ended_summary(det.ranks, True)


@pytest.mark.parametrize(
    ("preempt_time", "words"), [("2026-01-01T00:00:00", PREEMPTION), ("None", LIMIT)]
)
def test_the_slurm_follower_tells_the_clock_what_slurms_signal_was_for(
    preempt_time: str, words: str
) -> None:
    """SLURM's signal reached the ranks (the batch script's warning file or a node agent's
    G frame): scontrol's PreemptTime says whether a preemption sent it."""
    det, _ = warned_detector("limit")
    det.warning.warned_for(Cause.CHECKPOINT, "an earlier reason")  # type: ignore[union-attr]
    scontrol = f"JobId=12 JobState=RUNNING PreemptTime={preempt_time} Restarts=0"
    follower = SimpleNamespace(
        attempts=JobAttempts(12, max_resubmits=1, nodes=2),
        commands=FakeCommands(scontrol=(0, scontrol)),
        job_id=12,
        sup=SimpleNamespace(deadline=det.warning),
        notes=[],
        write_status=lambda: None,
        cadence=SimpleNamespace(poll_now=lambda: None),
    )
    follower.note = follower.notes.append
    Follower.warned(follower, "USR1", time.time())  # type: ignore[arg-type]
    assert det.warning is not None and det.warning.the_warning() == words
    cause = "a preemption" if words == PREEMPTION else "the time limit"
    assert follower.notes == [
        f"SLURM job 12: SIGUSR1 to every rank for {cause} (the ranks save a checkpoint and stop)"
    ]
