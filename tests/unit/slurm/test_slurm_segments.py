"""A SLURM run's segments (orchestrator/slurm/recovery/segments.py): how each job ended, which are
carried on, and what status.json and the summary say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.slurm.recovery.segments import Segments, describe_segment, ending, read_warning
from orchestrator.supervise import Outcome


@pytest.mark.parametrize(
    ("state", "warned", "ranks_ok", "expected"),
    [
        ("TIMEOUT", False, False, "time-limit"),  # SLURM killed it at the limit
        ("TIMEOUT", True, False, "time-limit"),
        ("FAILED", True, False, "time-limit"),  # the ranks stopped on the warning (exit 138)
        ("COMPLETED", True, False, "time-limit"),  # a program that exits 0 with a rank killed
        ("COMPLETED", True, True, "completed"),  # the warning came as the work finished
        ("PREEMPTED", False, False, "preempted"),  # PreemptMode=CANCEL
        ("CANCELLED", True, False, "cancelled"),  # scancel after the warning: never carried
        ("NODE_FAIL", False, False, "node-failure"),
        ("FAILED", False, False, "failed"),
        ("COMPLETED", False, True, "completed"),
        ("OUT_OF_MEMORY", False, False, "failed"),
    ],
)
def test_endings(state: str, warned: bool, ranks_ok: bool, expected: str) -> None:
    assert ending(state, warned, ranks_ok)[0] == expected


def test_a_run_carried_across_time_limits_lists_every_job() -> None:
    segments = Segments(101, max_resubmits=2)
    segments.running()
    line = segments.warned("USR1", 1000.0, preempted=False)
    assert line == (
        "SLURM job 101: SIGUSR1 to every rank for the time limit (the ranks save a "
        "checkpoint and stop)"
    )
    assert segments.ended("FAILED", ranks_ok=False) == "time-limit"
    assert segments.carry_on()
    assert segments.resubmitted(102) == (
        "segment 2: SLURM job 102 submitted, after job 101 its ranks stopped on the time "
        "limit's warning"
    )
    segments.running()
    assert segments.ended("TIMEOUT", ranks_ok=False) == "time-limit"
    segments.resubmitted(103)
    segments.running()
    assert segments.ended("COMPLETED", ranks_ok=True) == "completed"
    assert not segments.carry_on()
    status = segments.status()
    assert status["resubmits_left"] == 0
    assert [(s["job_id"], s["ended"], s["next"]) for s in status["segments"]] == [
        (101, "time-limit", "resubmitted as job 102"),
        (102, "time-limit", "resubmitted as job 103"),
        (103, "completed", None),
    ]
    assert status["segments"][0]["warning"] == "SIGUSR1 for the time limit"
    summary = segments.amend(Outcome("succeeded", 0, "")).summary.splitlines()
    assert summary[0] == "carried across 3 segment(s):"
    assert re.fullmatch(
        r"  1\. job 101 ran \d\d:\d\d:\d\d-\d\d:\d\d:\d\d: its ranks stopped on the time "
        r"limit's warning \(FAILED\); SIGUSR1 for the time limit at \d\d:\d\d:\d\d; "
        r"resubmitted as job 102",
        summary[1],
    ), summary[1]
    assert re.fullmatch(r"  3\. job 103 ran \S+: completed \(COMPLETED\)", summary[3])


def test_resubmits_used_up_end_the_run_with_124_and_say_so() -> None:
    segments = Segments(7, max_resubmits=0)
    segments.ended("TIMEOUT", ranks_ok=False)
    assert not segments.carry_on()
    outcome = segments.amend(Outcome("failed", 1, "job ended: SLURM job 7 ended TIMEOUT"))
    assert outcome.exit_code == 124
    assert "--max-resubmits 0 used up" in outcome.summary


def test_a_preemption_requeued_by_slurm_is_a_new_segment_of_the_same_job() -> None:
    segments = Segments(5, max_resubmits=3)
    segments.running()
    segments.warned("USR1", 1.0, preempted=True)
    assert segments.requeued("PENDING", "BeginTime") == (
        "segment 2: SLURM job 5 preempted by a higher-priority job; requeued by SLURM"
    )
    assert segments.left == 3  # SLURM's requeue costs no resubmission
    segments.running()
    segments.ended("COMPLETED", ranks_ok=True)
    entries = segments.status()["segments"]
    assert [(e["job_id"], e["ended"]) for e in entries] == [(5, "preempted"), (5, "completed")]
    assert entries[0]["warning"] == "SIGUSR1 for a preemption"


def test_a_preemption_with_cancel_mode_is_resubmitted_and_a_cancel_never() -> None:
    segments = Segments(9, max_resubmits=1)
    segments.warned("USR1", 1.0, preempted=True)
    assert segments.ended("FAILED", ranks_ok=False) == "preempted"  # stopped on its warning
    assert segments.carry_on()
    segments.resubmitted(10)
    assert segments.ended("CANCELLED", ranks_ok=False) == "cancelled"
    assert not segments.carry_on()


def test_a_preempted_job_whose_script_ended_first_is_resubmitted() -> None:
    """No --signal: SLURM's SIGTERM ends the ranks, the script exits, the job FAILED."""
    segments = Segments(3, max_resubmits=1)
    segments.preempted()
    assert segments.ended("FAILED", ranks_ok=False) == "preempted"
    assert segments.carry_on()


def test_a_node_failure_segment_says_its_own_why() -> None:
    segments = Segments(1, max_resubmits=2)
    segments.ended("NODE_FAIL", ranks_ok=False)
    segments.resubmitted(2, "SLURM job 1 ended NODE_FAIL: n2 is down*")
    entry = segments.status()["segments"][0]
    assert (entry["ended"], entry["why"]) == (
        "node-failure",
        "SLURM job 1 ended NODE_FAIL: n2 is down*",
    )
    assert segments.left == 2  # spares count their own
    assert describe_segment(entry).startswith("1. job 1: SLURM job 1 ended NODE_FAIL")


def test_the_warning_file(tmp_path: Path) -> None:
    path = tmp_path / "warning"
    assert read_warning(path) is None
    path.write_text("USR1 1795876100.289887\n")
    assert read_warning(path) == ("USR1", 1795876100.289887)
    path.write_text("USR1")  # half written
    assert read_warning(path) is None
