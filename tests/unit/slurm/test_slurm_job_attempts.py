"""A SLURM run's attempts (orchestrator/slurm/recovery/job_attempts.py): how each job ended,
which are carried on, and what status.json and the summary say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.slurm.recovery.job_attempts import (
    JobAttempts,
    describe_job_attempt,
    ending,
    read_warning,
)
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
    attempts = JobAttempts(101, max_resubmits=2)
    attempts.running()
    line = attempts.warned("USR1", 1000.0, preempted=False)
    assert line == (
        "SLURM job 101: SIGUSR1 to every rank for the time limit (the ranks save a "
        "checkpoint and stop)"
    )
    assert attempts.ended("FAILED", ranks_ok=False) == "time-limit"
    assert attempts.carry_on()
    assert attempts.resubmitted(102) == (
        "attempt 2: SLURM job 102 submitted, after job 101 its ranks stopped on the time "
        "limit's warning"
    )
    attempts.running()
    assert attempts.ended("TIMEOUT", ranks_ok=False) == "time-limit"
    attempts.resubmitted(103)
    attempts.running()
    assert attempts.ended("COMPLETED", ranks_ok=True) == "completed"
    assert not attempts.carry_on()
    status = attempts.status()
    assert status["resubmits_left"] == 0 and status["attempt"] == 3  # the current one, as SSH
    assert [(s["job_id"], s["ended"], s["next"]) for s in status["attempts"]] == [
        (101, "time-limit", "resubmitted as job 102"),
        (102, "time-limit", "resubmitted as job 103"),
        (103, "completed", None),
    ]
    assert status["attempts"][0]["warning"] == "SIGUSR1 for the time limit"
    summary = attempts.amend(Outcome("succeeded", 0, "")).summary.splitlines()
    assert summary[0] == "carried across 3 attempt(s):"
    assert re.fullmatch(
        r"  1\. job 101 ran \d\d:\d\d:\d\d-\d\d:\d\d:\d\d: its ranks stopped on the time "
        r"limit's warning \(FAILED\); SIGUSR1 for the time limit at \d\d:\d\d:\d\d; "
        r"resubmitted as job 102",
        summary[1],
    ), summary[1]
    assert re.fullmatch(r"  3\. job 103 ran \S+: completed \(COMPLETED\)", summary[3])


def test_resubmits_used_up_end_the_run_with_124_and_say_so() -> None:
    attempts = JobAttempts(7, max_resubmits=0)
    attempts.ended("TIMEOUT", ranks_ok=False)
    assert not attempts.carry_on()
    outcome = attempts.amend(Outcome("failed", 1, "job ended: SLURM job 7 ended TIMEOUT"))
    assert outcome.exit_code == 124
    assert "--max-resubmits 0 used up" in outcome.summary


def test_a_preemption_requeued_by_slurm_is_a_new_attempt_of_the_same_job() -> None:
    attempts = JobAttempts(5, max_resubmits=3)
    attempts.running()
    attempts.warned("USR1", 1.0, preempted=True)
    assert attempts.requeued("PENDING", "BeginTime") == (
        "attempt 2: SLURM job 5 preempted by a higher-priority job; requeued by SLURM"
    )
    assert attempts.left == 3  # SLURM's requeue costs no resubmission
    attempts.running()
    attempts.ended("COMPLETED", ranks_ok=True)
    entries = attempts.status()["attempts"]
    assert [(e["job_id"], e["ended"]) for e in entries] == [(5, "preempted"), (5, "completed")]
    assert entries[0]["warning"] == "SIGUSR1 for a preemption"


def test_a_preemption_with_cancel_mode_is_resubmitted_and_a_cancel_never() -> None:
    attempts = JobAttempts(9, max_resubmits=1)
    attempts.warned("USR1", 1.0, preempted=True)
    assert attempts.ended("FAILED", ranks_ok=False) == "preempted"  # stopped on its warning
    assert attempts.carry_on()
    attempts.resubmitted(10)
    assert attempts.ended("CANCELLED", ranks_ok=False) == "cancelled"
    assert not attempts.carry_on()


def test_a_preempted_job_whose_script_ended_first_is_resubmitted() -> None:
    """No --signal: SLURM's SIGTERM ends the ranks, the script exits, the job FAILED."""
    attempts = JobAttempts(3, max_resubmits=1)
    attempts.preempted()
    assert attempts.ended("FAILED", ranks_ok=False) == "preempted"
    assert attempts.carry_on()


def test_a_node_failure_attempt_says_its_own_why() -> None:
    attempts = JobAttempts(1, max_resubmits=2)
    attempts.ended("NODE_FAIL", ranks_ok=False)
    attempts.resubmitted(2, "SLURM job 1 ended NODE_FAIL: n2 is down*")
    entry = attempts.status()["attempts"][0]
    assert (entry["ended"], entry["why"]) == (
        "node-failure",
        "SLURM job 1 ended NODE_FAIL: n2 is down*",
    )
    assert attempts.left == 2  # spares count their own
    assert describe_job_attempt(entry).startswith("1. job 1: SLURM job 1 ended NODE_FAIL")


def test_the_warning_file(tmp_path: Path) -> None:
    path = tmp_path / "warning"
    assert read_warning(path) is None
    path.write_text("USR1 1795876100.289887\n")
    assert read_warning(path) == ("USR1", 1795876100.289887)
    path.write_text("USR1")  # half written
    assert read_warning(path) is None
