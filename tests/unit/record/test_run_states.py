"""A run's state as an enum (record/states.py), and the one rule for the state a reader of
its record sees, which the API (`Run`) and the command line (`status`, `runs`) share."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import orchestrator
from orchestrator.api.run_handle import Run
from orchestrator.cli.views import runs_table, shown_state, status_text
from orchestrator.record.runs import RunRecord, process_start_time
from orchestrator.record.states import RunState, RunStatus, observed_state
from orchestrator.slurm import backend as slurm_backend  # where a SLURM run asks squeue

FINAL = {"succeeded", "failed", "stopped", "lost", "hung", "unreachable"}
ACTIVE = {"starting", "queued", "running", "stopping", "recovering"}


@pytest.mark.parametrize("state", list(RunState))
def test_every_state_is_final_or_not(state: RunState) -> None:
    assert state.is_final == (state.value in FINAL)
    assert state.value in FINAL | ACTIVE


def test_the_states_are_the_words_status_json_keeps() -> None:
    assert {state.value for state in RunState} == FINAL | ACTIVE
    assert json.loads(json.dumps({"state": RunState.HUNG})) == {"state": "hung"}
    assert RunState.FAILED == "failed" and f"{RunState.FAILED}" == str(RunState.FAILED) == "failed"
    assert RunState.parse("lost") is RunState.LOST and RunState.parse("?") is None
    assert RunState.parse(None) is None
    assert orchestrator.RunState is RunState


# (recorded, backend, controller alive) -> the state a reader sees
RULE = [
    (RunState.RUNNING, "ssh", True, RunState.RUNNING),
    (RunState.RUNNING, "ssh", False, RunState.LOST),  # its nodes stop by themselves
    (RunState.STARTING, "local", False, RunState.LOST),
    (RunState.STOPPING, "ssh", False, RunState.LOST),
    (RunState.RECOVERING, "ssh", False, RunState.LOST),
    (RunState.RUNNING, "slurm", False, RunState.RUNNING),  # the job goes on without it
    (RunState.QUEUED, "slurm", False, RunState.QUEUED),
    (RunState.RUNNING, "slurm", True, RunState.RUNNING),
    (RunState.SUCCEEDED, "ssh", False, RunState.SUCCEEDED),  # an end recorded stays
    (RunState.HUNG, "ssh", False, RunState.HUNG),
    (RunState.UNREACHABLE, "ssh", False, RunState.UNREACHABLE),
    (RunState.FAILED, "slurm", False, RunState.FAILED),
    (None, "ssh", False, None),  # a word we do not know stays the record's
]


@pytest.mark.parametrize(("recorded", "backend", "alive", "seen"), RULE)
def test_the_state_a_reader_sees(recorded, backend, alive, seen) -> None:
    assert observed_state(recorded, backend, alive) is seen


def document(state: str, backend: str, alive: bool) -> dict:
    pid = os.getpid() if alive else 0
    controller = {"pid": pid, "start_time": process_start_time(pid) if alive else None}
    return {
        "run_id": "r1", "backend": backend, "state": state, "controller": controller,
        "exit_code": None, "summary": None, "started_at": "2026-01-01T00:00:00.000Z",
    }  # fmt: skip


@pytest.mark.parametrize(("recorded", "backend", "alive", "seen"), RULE)
def test_the_command_line_and_the_api_see_the_same_state(
    recorded, backend, alive, seen, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    word = recorded.value if recorded is not None else "?"
    status = document(word, backend, alive)
    record = RunRecord.create(tmp_path, "r1")
    record.write_status(status)
    monkeypatch.setattr(slurm_backend, "refresh_status", lambda record, status: status)
    assert Run("r1", tmp_path).state is seen
    shown = seen.value if seen is not None else "?"
    assert shown_state(status) == shown
    assert status_text(status).splitlines()[0] == f"run r1: {shown}"
    assert runs_table([("r1", status)], str(tmp_path)).splitlines()[1].split()[1] == shown


def test_a_status_keeps_its_document_and_says_who_writes_it() -> None:
    status = RunStatus.of(document("running", "ssh", True), controller_alive=True)
    assert (status.run_id, status.state, status.exit_code) == ("r1", RunState.RUNNING, None)
    assert status.being_written and not status.ended and not status.asks_slurm
    assert status.document["controller"]["pid"] == os.getpid()
    lost = RunStatus.of(document("running", "ssh", False), controller_alive=False)
    assert lost.ended and not lost.ended_in_record and not lost.being_written
    assert lost.recorded_state is RunState.RUNNING and lost.state is RunState.LOST
    unfollowed = RunStatus.of(document("running", "slurm", False), controller_alive=False)
    assert unfollowed.asks_slurm and not unfollowed.ended and not unfollowed.being_written


def test_wait_asks_slurm_about_a_job_no_controller_follows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = RunRecord.create(tmp_path, "r1")
    record.write_status({**document("running", "slurm", False), "slurm_job_id": 7})
    asked = []

    def squeue_says_ended(record: RunRecord, status: dict) -> dict:
        asked.append(status["slurm_job_id"])
        ended = {**status, "state": RunState.SUCCEEDED, "exit_code": 0}
        record.write_status(ended)  # as slurm.client.refresh_status records it
        return ended

    monkeypatch.setattr(slurm_backend, "refresh_status", squeue_says_ended)
    outcome = Run("r1", tmp_path).wait(timeout=5)
    assert (outcome.state, outcome.exit_code, asked) == (RunState.SUCCEEDED, 0, [7])
    assert json.loads(record.status_path.read_text())["state"] == "succeeded"


def test_an_ssh_run_whose_controller_is_gone_ends_lost(tmp_path: Path) -> None:
    record = RunRecord.create(tmp_path, "r1")
    record.write_status(document("running", "ssh", False))
    run = Run("r1", tmp_path)
    assert run.done()
    outcome = run.wait(timeout=5)
    assert (outcome.state, outcome.exit_code) == (RunState.LOST, 1)
    assert str(outcome.state) == "lost"
