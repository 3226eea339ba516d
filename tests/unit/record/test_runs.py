"""The run record: folder layout, run ids, atomic status.json, listing, controller liveness."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import ConfigError
from orchestrator.record.runs import (
    RunRecord,
    check_run_id,
    controller_alive,
    list_runs,
    new_run_id,
    now_iso,
    process_start_time,
)
from orchestrator.record.states import RunState


def test_create_makes_the_folder_and_logs(tmp_path) -> None:
    record = RunRecord.create(tmp_path / "runs", "r1")
    assert record.path == tmp_path / "runs" / "r1" and record.run_id == "r1"
    assert record.logs_dir.is_dir() and not record.status_path.exists()


def test_create_refuses_an_existing_run(tmp_path) -> None:
    RunRecord.create(tmp_path, "r1")
    with pytest.raises(ConfigError, match="run 'r1' already exists"):
        RunRecord.create(tmp_path, "r1")


def test_create_under_a_file_says_the_run_dir_is_the_problem(tmp_path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(ConfigError) as info:
        RunRecord.create(not_a_dir, "r1")
    assert "--run-dir" in str(info.value) and "already exists" not in str(info.value)


@pytest.mark.parametrize(
    "run_id",
    ["", "a/b", "../x", ".hidden", "-r", "a b", "a\n", "r1\n", "x" * 101, "é", "a;b", "$(id)"],
)
def test_bad_run_ids_are_refused(tmp_path, run_id: str) -> None:
    with pytest.raises(ConfigError, match="--run-id"):
        check_run_id(run_id)
    with pytest.raises(ConfigError):
        RunRecord.create(tmp_path, run_id)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("run_id", ["r", "20261122-153012-a3f9", "exp_1.2", "A" * 100])
def test_good_run_ids(run_id: str) -> None:
    assert check_run_id(run_id) == run_id


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=12))
def test_any_accepted_run_id_is_one_plain_folder_name(run_id: str) -> None:
    try:
        check_run_id(run_id)
    except ConfigError:
        return
    assert run_id not in (".", "..") and "/" not in run_id and run_id.isascii()
    assert run_id.isprintable() and run_id.strip() == run_id and not run_id.startswith("-")


def test_new_run_ids_are_valid_and_sortable() -> None:
    first = new_run_id()
    assert check_run_id(first) == first and len(first) == len("20261122-153012-a3f9")
    assert first[:15] <= new_run_id()[:15]


def test_status_round_trip_and_open(tmp_path) -> None:
    record = RunRecord.create(tmp_path, "r1")
    with pytest.raises(ConfigError, match="no run 'r1'"):  # no status yet: not a run
        RunRecord.open(tmp_path, "r1")
    record.write_status({"state": "running", "n": 1})
    opened = RunRecord.open(tmp_path, "r1")
    assert opened.read_status() == {"state": "running", "n": 1}
    assert sorted(p.name for p in record.path.iterdir()) == ["logs", "status.json"]


@pytest.mark.parametrize("run_id", ["missing", "../r1", "r1/..", ""])
def test_open_unknown_or_bad_run(tmp_path, run_id: str) -> None:
    RunRecord.create(tmp_path, "r1").write_status({"state": "running"})
    with pytest.raises(ConfigError) as info:
        RunRecord.open(tmp_path, run_id)
    assert "orchestrator runs --run-dir" in str(info.value)


@pytest.mark.parametrize("text", ["{not json", "", "[1, 2]", "null", "\xff"])
def test_read_status_of_a_corrupt_file_is_a_config_error(tmp_path, text: str) -> None:
    record = RunRecord.create(tmp_path, "r1")
    record.status_path.write_text(text, encoding="latin-1")
    with pytest.raises(ConfigError, match="cannot read"):
        record.read_status()


def test_status_writes_are_atomic_for_readers(tmp_path) -> None:
    record = RunRecord.create(tmp_path, "r1")
    record.write_status({"i": -1, "pad": ""})
    stop = threading.Event()
    seen: list[int] = []
    errors: list[Exception] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.append(json.loads(record.status_path.read_text())["i"])
            except Exception as exc:  # a torn read is what this test looks for
                errors.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    for i in range(150):
        record.write_status({"i": i, "pad": "x" * (i * 997 % 50000)})
    stop.set()
    thread.join()
    assert errors == [] and seen and seen == sorted(seen)
    assert sorted(p.name for p in record.path.iterdir()) == ["logs", "status.json"]


def test_list_runs_orders_by_start_and_skips_non_runs(tmp_path) -> None:
    for run_id, started in (
        ("b", "2026-01-02T00:00:00.000Z"),
        ("a", "2026-01-03T00:00:00.000Z"),
        ("c", "2026-01-01T00:00:00.000Z"),
    ):
        RunRecord.create(tmp_path, run_id).write_status({"started_at": started})
    RunRecord.create(tmp_path, "no-status")
    RunRecord.create(tmp_path, "corrupt").status_path.write_text("{")
    RunRecord.create(tmp_path, "not-an-object").status_path.write_text("[]")
    (tmp_path / "stray.txt").write_text("x")
    assert [run_id for run_id, _ in list_runs(tmp_path)] == ["c", "b", "a"]
    assert list_runs(tmp_path / "nowhere") == []


# --- controller liveness -----------------------------------------------------------------


def test_controller_alive_for_this_process() -> None:
    pid = os.getpid()
    started = process_start_time(pid)
    assert isinstance(started, int) and started > 0
    assert controller_alive({"controller": {"pid": pid, "start_time": started}})


def test_recycled_pid_is_not_the_controller() -> None:
    pid = os.getpid()  # alive, but started at another time than the recorded controller
    assert not controller_alive(
        {"controller": {"pid": pid, "start_time": process_start_time(pid) - 1}}
    )


def test_dead_or_unrecorded_controller() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = process_start_time(child.pid)
    child.wait()
    assert process_start_time(child.pid) is None
    assert not controller_alive({"controller": {"pid": child.pid, "start_time": started}})
    assert not controller_alive({})
    assert not controller_alive({"controller": None})
    assert not controller_alive({"controller": {"pid": os.getpid(), "start_time": None}})
    assert not controller_alive({"controller": {"pid": 0, "start_time": 0}})


def test_start_time_of_a_process_with_spaces_and_parens_in_its_name(tmp_path) -> None:
    # /proc/PID/stat puts the command name in parentheses; it may hold ") 1 2 (".
    odd = tmp_path / "x) 1 2 (y"
    odd.symlink_to("/bin/sleep")
    before = process_start_time(os.getpid())
    child = subprocess.Popen([str(odd), "5"])
    try:
        time.sleep(0.05)
        with open(f"/proc/{child.pid}/stat", "rb") as handle:
            assert b"(x) 1 2 (y)" in handle.read()
        started = process_start_time(child.pid)
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        ticks_now = uptime * os.sysconf("SC_CLK_TCK")
        assert before <= started <= ticks_now + 1
    finally:
        child.kill()
        child.wait()


def test_states_and_timestamps() -> None:
    assert {"running", "succeeded", "failed"} <= {state.value for state in RunState}
    assert now_iso(0) == "1970-01-01T00:00:00.000Z"
    assert now_iso().endswith("Z")
