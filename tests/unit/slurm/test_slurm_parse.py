"""What SLURM prints, read by orchestrator.slurm.control.parse: outputs captured from SLURM 22.05.

The `scontrol -o show job` records in tests/data/slurm/ were captured on the lab cluster
(paths replaced). sacct has no accounting storage in the lab; its lines follow
`sacct -n -P -X -o State,ExitCode,NodeList` as documented.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.backends.scheduler_states import SchedulerState
from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator.slurm.control.client import SlurmCommands, unreachable_or
from orchestrator.slurm.control.parse import (
    SLURM_STATES,
    UNRUNNABLE,
    JobInfo,
    parse_exit_code,
    parse_job_id,
    parse_pairs,
    parse_sacct,
    parse_scontrol_job,
    parse_sinfo_idle,
    parse_squeue,
    slurm_state,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "slurm"


def captured(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize(
    ("stdout", "job_id"),
    [
        ("16\n", 16),  # sbatch --parsable
        ("17;olab19\n", 17),  # --parsable on a multi-cluster setup: id;cluster
        ("Submitted batch job 9\n", 9),  # plain sbatch
        ("sbatch: warning: can't honor --ntasks-per-node set to 1\n18\n", 18),
    ],
)
def test_job_id_from_sbatch(stdout: str, job_id: int) -> None:
    assert parse_job_id(stdout) == job_id


def test_sbatch_without_a_job_id_is_an_error() -> None:
    with pytest.raises(OrchestratorError, match="no job id"):
        parse_job_id("sbatch: error: something\n")


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("0:0", 0),
        ("3:0", 3),
        ("1:0", 1),
        ("0:15", 143),
        ("0:9", 137),
        ("", None),
        ("n/a", None),
    ],
)
def test_exit_code_exit_and_signal(text: str, code: int | None) -> None:
    assert parse_exit_code(text) == code


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        ("RUNNING|None|olab19-node[0-1]\n", JobInfo("RUNNING", "None", "olab19-node[0-1]")),
        ("PENDING|PartitionNodeLimit|\n", JobInfo("PENDING", "PartitionNodeLimit", "")),
        ("PENDING|PartitionConfig|\n", JobInfo("PENDING", "PartitionConfig", "")),
        ("PENDING|BeginTime|\n", JobInfo("PENDING", "BeginTime", "")),  # after a requeue
        (
            "COMPLETING|NonZeroExitCode|olab19-node0\n",
            JobInfo("COMPLETING", "NonZeroExitCode", "olab19-node0"),
        ),
        ("", None),  # squeue -h -j ID of a job that has left the queue
    ],
)
def test_squeue_state_reason_nodes(stdout: str, expected: JobInfo | None) -> None:
    assert parse_squeue(stdout) == expected


def test_unrunnable_reasons_are_what_squeue_shows() -> None:
    assert {"PartitionNodeLimit", "PartitionConfig"} <= UNRUNNABLE.keys()
    assert "BeginTime" not in UNRUNNABLE and "Resources" not in UNRUNNABLE


def test_scontrol_job_after_a_requeue() -> None:
    info = parse_scontrol_job(captured("scontrol-completed-after-requeue.txt"))
    assert info == JobInfo("COMPLETED", "None", "olab19-node[0-1]", 0, 1, "scontrol")
    assert info.ended


def test_scontrol_failed_job() -> None:
    info = parse_scontrol_job(captured("scontrol-failed.txt"))
    assert (info.state, info.reason, info.exit_code, info.restarts) == (
        "FAILED",
        "NonZeroExitCode",
        1,
        0,
    )


def test_scontrol_cancelled_job_exit_code_is_the_signal() -> None:
    info = parse_scontrol_job(captured("scontrol-cancelled.txt"))
    assert (info.state, info.exit_code, info.nodelist) == ("CANCELLED", 143, "olab19-node0")


def test_scontrol_job_cancelled_while_pending_has_no_nodes() -> None:
    info = parse_scontrol_job(captured("scontrol-cancelled-while-pending.txt"))
    assert (info.state, info.reason, info.nodelist) == ("CANCELLED", "PartitionNodeLimit", "")


def test_scontrol_pairs_keep_keys_with_colons_and_slashes() -> None:
    pairs = parse_pairs(captured("scontrol-failed.txt"))
    assert pairs["AllocNode:Sid"] == "localhost:23725"
    assert pairs["CPUs/Task"] == "1"
    assert pairs["TRES"] == "cpu=2,node=2,billing=2"
    assert pairs["Command"] == "/home/user/work/runs/login1/job.sbatch"
    assert parse_pairs("JobId=3 Command=/a b/c.sh WorkDir=/x")["Command"] == "/a b/c.sh"


def test_scontrol_of_an_unknown_job() -> None:
    assert parse_scontrol_job("") is None
    assert parse_scontrol_job("slurm_load_jobs error: Invalid job id specified\n") is None


@pytest.mark.parametrize(
    ("stdout", "state", "code", "restarts"),
    [
        ("COMPLETED|0:0|node[1-2]\n", "COMPLETED", 0, 0),
        ("CANCELLED by 0|0:15|node1\n", "CANCELLED", 143, 0),
        ("FAILED|3:0|node[1-2]\n", "FAILED", 3, 0),
        ("REQUEUED|0:0|node[1-2]\nCOMPLETED|0:0|node[3-4]\n", "COMPLETED", 0, 1),
        ("TIMEOUT|0:0|node1\n", "TIMEOUT", 0, 0),
    ],
)
def test_sacct_lines(stdout: str, state: str, code: int, restarts: int) -> None:
    info = parse_sacct(stdout)
    assert (info.state, info.exit_code, info.restarts) == (state, code, restarts)


def test_sacct_without_accounting_knows_nothing() -> None:
    # stdout is empty; stderr says "Slurm accounting storage is disabled"
    assert parse_sacct("") is None


# SLURM's words for a job that has ended (and UNKNOWN, ours for a job SLURM forgot).
ENDED_WORDS = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED", "UNKNOWN",
}  # fmt: skip


def test_slurm_states_in_our_words_keep_every_distinction_decided_on() -> None:
    assert {word for word, state in SLURM_STATES.items() if state.ended} == ENDED_WORDS
    assert [w for w in SLURM_STATES if slurm_state(w).on_nodes] == ["RUNNING", "COMPLETING"]
    waiting = [w for w in SLURM_STATES if slurm_state(w).waiting]
    assert waiting == ["PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"]
    assert slurm_state("TIMEOUT") != slurm_state("DEADLINE")  # only TIMEOUT is the time limit
    said = {slurm_state(w) for w in ("TIMEOUT", "DEADLINE", "NODE_FAIL", "BOOT_FAIL")}
    assert len(said) == 4 and SchedulerState.OTHER not in said
    newer = slurm_state("RESIZING")  # a word no decision turns on: not ended, not running
    assert newer == SchedulerState.OTHER and not newer.ended and not newer.on_nodes
    info = JobInfo("CANCELLED", source="sacct")
    assert (info.state, info.scheduler_state, info.ended) == ("CANCELLED", "cancelled", True)
    assert f"{SchedulerState.TIME_LIMIT}" == "time-limit"


def test_sinfo_idle_nodes() -> None:
    out = "node1|idle\nnode2|allocated\nnode3|idle\nnode4|down*\n"
    assert parse_sinfo_idle(out) == {"node1", "node3"}
    assert parse_sinfo_idle("") == set()


def test_unreachable_controller_message_says_what_to_check() -> None:
    error = unreachable_or(
        "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n",
        ["squeue"],
        "on this machine",
    )
    assert "cannot reach the SLURM controller" in str(error)
    assert "SLURM_CONF" in str(error) and error.exit_code == 1
    other = unreachable_or("squeue: error: Invalid user\n", ["squeue", "-h"], "on this machine")
    assert str(other) == "squeue -h failed on this machine: squeue: error: Invalid user"


def test_missing_command_is_a_clear_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="sbatch: command not found.*--login HOST"):
        SlurmCommands().run(["sbatch", "--version"])
