"""A run's goodput (record/goodput.py): hand-built records whose phases are known, each
adding up to the wall time exactly; the clock of a rank's own times; the words."""

from __future__ import annotations

import math

import pytest

from orchestrator.record.goodput.phases import PHASES, compute, inputs_of, is_mark
from orchestrator.record.goodput.words import duration, goodput_line, goodput_table
from orchestrator.record.runs import now_iso

T = 1_800_000_000.0  # the runs' start


def at(offset: float) -> str:
    return now_iso(T + offset)


def event(when: float, kind: str, host: str | None = "a", detail: str = "") -> dict:
    return {"time": T + when, "host": host, "node_rank": 0, "event": kind, "detail": detail}


def progress(when: float, rank: int, step: int, host: str = "a", steps: int = 5, delay=0.0):
    """A rank's record of `steps` steps of 1 s each, done at `when`, arriving `delay` later."""
    metrics = {"step": step, "steps": steps, "step_s": 1.0, "time": T + when}
    return {"time": T + when + delay, "host": host, "rank": rank, "metrics": metrics}


def mark(when: float, rank: int = 0, host: str = "a", **what) -> dict:
    return {"time": T + when, "host": host, "rank": rank, "metrics": {**what, "time": T + when}}


def world(*entries: tuple[int, float, int]) -> list[dict]:
    return [
        {"attempt": n, "nodes": [f"n{i}" for i in range(nodes)], "ranks": nodes, "since": at(s)}
        for n, s, nodes in entries
    ]


def phases_of(status: dict, records: list[dict], end: float):
    inputs = inputs_of({"started_at": at(0), **status}, records)
    assert inputs is not None
    found = compute(inputs, T + end)
    assert math.isclose(sum(found.phases.values()), end, abs_tol=1e-6)
    for attempt in found.attempts:
        assert math.isclose(sum(attempt["phases"].values()), attempt["wall_s"], abs_tol=1e-2)
    timeline = found.timeline
    assert timeline[0][0] == T and timeline[-1][1] == T + end
    assert all(a[1] == b[0] for a, b in zip(timeline, timeline[1:], strict=False))
    return found


def only(phases: dict, **expected: float) -> None:
    """`phases` hold `expected` (seconds) and nothing else."""
    for name in PHASES:
        assert phases[name] == pytest.approx(expected.get(name, 0.0), abs=1e-6), name


def test_a_run_without_faults_is_waiting_starting_training_saves_and_stopping() -> None:
    records = [event(0, "probe", "a", "2.0 s"), event(0, "probe", "b", "3.0 s")]
    records += [event(6, "start", h) for h in "ab"]
    for step in range(10, 80, 10):  # steps 10 s apart from 10 s on: the first began at 10 s
        records += [progress(10 + step, r, step, "ab"[r], steps=10) for r in (0, 1)]
    records += [mark(42, checkpoint=30, save_s=2.0), mark(72, checkpoint=60, save_s=2.0)]
    records += [event(90, "end", h) for h in "ab"]
    found = phases_of({"world": world((1, 4, 2))}, records, 100)
    only(found.phases, waiting=3, starting=7, training=66, checkpoints=4, stopping=20)
    assert found.steps and found.ratio == pytest.approx(0.66) and found.redone_steps == 0
    assert not found.faults and found.attempts[0]["steps"] == [0, 70]


def lost_node_run() -> tuple[dict, list[dict]]:
    """Three nodes; c is lost at 40 s, after the checkpoint of step 20 and 5 steps more; a
    spare (d, probed 45-50 s) takes its place in attempt 2, which resumes from step 20."""
    records = [mark(10, from_step=0)]
    for when, step in ((15, 5), (20, 10), (25, 15), (30, 20), (35, 25)):
        records += [progress(when, r, step, "abc"[r]) for r in range(3)]
    records += [mark(21, checkpoint=10, save_s=1.0), mark(31, checkpoint=20, save_s=1.0)]
    records += [event(40, "lost", "c", "no word for 5 s"), event(42, "end", "a")]
    records += [event(42, "end", "b"), event(45, "probe", "d", "5.0 s")]
    records += [event(62, "start", h) for h in "abd"]
    records.append(mark(65, from_step=20))
    for when, step in ((70, 25), (75, 30), (80, 35), (85, 40), (90, 45)):
        records += [progress(when, r, step, "abd"[r]) for r in range(3)]
    records += [event(92, "end", h) for h in "abd"]
    return {"world": world((1, 1, 3), (2, 60, 3))}, records


def test_a_node_lost_costs_its_detection_its_restart_and_the_steps_redone() -> None:
    status, records = lost_node_run()
    found = phases_of(status, records, 95)
    first, second = found.attempts
    only(
        first["phases"],
        starting=10, training=19, checkpoints=2, redone=4, detecting=5, stopping=15, waiting=5,
    )  # fmt: skip
    only(second["phases"], starting=5, training=25, stopping=5)
    assert first["steps"] == [0, 25] and second["steps"] == [20, 45]
    assert found.redone_steps == 5  # steps 21-25: done after the checkpoint of 20, then again
    (fault,) = found.faults
    assert (fault.event, fault.detect_s, fault.restart_s) == ("lost", 5.0, 25.0)
    assert fault.redone_s == pytest.approx(4.0)
    assert found.ratio == pytest.approx(44 / 95)
    kept = found.to_dict()
    assert kept["faults"]["count"] == 1 and kept["wall_s"] == 95.0
    assert kept["phases"]["training"] == 44.0 and kept["redone_steps"] == 5


def test_without_marks_the_first_record_says_where_a_stint_began() -> None:
    status, records = lost_node_run()
    records = [r for r in records if "from_step" not in r.get("metrics", {})]
    found = phases_of(status, records, 95)
    assert found.redone_steps == 5 and found.attempts[1]["steps"] == [20, 45]


def test_a_resume_from_an_older_checkpoint_redoes_the_steps_after_it() -> None:
    status, records = lost_node_run()
    for record in records:  # attempt 2 resumed from step 10, not 20
        if "from_step" in record.get("metrics", {}):
            record["metrics"]["from_step"] = 10
    found = phases_of(status, records, 95)
    assert found.redone_steps == 15
    # redone from the save of step 10 on (20 s): 15 s less the save of step 20
    assert found.attempts[0]["phases"]["redone"] == pytest.approx(13.0)
    assert found.attempts[0]["phases"]["training"] == pytest.approx(10.0)


def test_a_ranks_own_times_are_put_into_the_controllers_clock() -> None:
    status, records = lost_node_run()
    for record in records:  # node c's clock is 100 s ahead; its records come 0-2 s late
        if record.get("host") == "c" and "metrics" in record:
            record["metrics"]["time"] += 100.0
            record["time"] += (record["metrics"]["step"] % 3) * 1.0
    found = phases_of(status, records, 95)
    assert found.attempts[0]["phases"]["training"] == pytest.approx(19.0)


def test_time_on_fewer_nodes_is_the_share_the_missing_nodes_did_not_train() -> None:
    status, records = lost_node_run()
    status = {"world": world((1, 1, 4), (2, 60, 3))}  # launched on 4, went on with 3
    found = phases_of(status, records, 95)
    second = found.attempts[1]["phases"]
    assert second["training"] == pytest.approx(25 * 3 / 4)
    assert second["fewer_nodes"] == pytest.approx(25 / 4)


def test_a_restart_within_an_attempt_cuts_its_training_in_two() -> None:
    records = [progress(when, 0, step) for when, step in ((10, 5), (15, 10), (20, 15))]
    records += [mark(16, checkpoint=10, save_s=1.0)]
    records += [event(24, "failed", "a", "rank 0: exit code 1"), event(30, "restart", "a")]
    records += [progress(when, 0, step) for when, step in ((40, 15), (45, 20))]
    found = phases_of({"world": world((1, 0, 1))}, records, 50)
    # 0-5 starting, 5-15 training, 15-16 save, 16-20 redone, 20-24 detecting, 24-35 starting
    # again (the restart), 35-45 training, 45-50 stopping
    only(found.phases, starting=16, training=20, checkpoints=1, redone=4, detecting=4, stopping=5)
    (fault,) = found.faults
    assert (fault.detect_s, fault.restart_s, found.redone_steps) == (4.0, 11.0, 5)


SLURM_JOBS = [
    {"attempt": 1, "job_id": 7, "submitted_at": at(0), "running_at": at(10)},
    {"attempt": 2, "job_id": 8, "submitted_at": at(50), "running_at": at(58)},
]


def slurm_records() -> list[dict]:
    """Two SLURM jobs' ranks (SLURM_JOBS): a node lost in the first, no steps."""
    records = [event(12, "start", h) for h in "ab"]
    records += [event(30, "lost", "b"), event(33, "end", "a")]
    return records + [event(60, "start", h) for h in "ac"] + [event(80, "end", h) for h in "ac"]


def test_a_program_without_steps_gets_what_is_known_without_them() -> None:
    found = phases_of({"attempts": SLURM_JOBS}, slurm_records(), 85)
    assert not found.steps
    only(found.attempts[0]["phases"], waiting=10, starting=2, running=18, stopping=20)
    only(found.attempts[1]["phases"], waiting=8, starting=2, running=20, stopping=5)
    (fault,) = found.faults
    assert (fault.detect_s, fault.restart_s) == (0.0, 30.0)
    kept = found.to_dict()
    assert not kept["steps"] and kept["note"].startswith("the program reported no steps")
    line = goodput_line(kept)
    assert line.startswith("goodput not measured: the program reported no steps"), line
    assert "running 38 s" in line and "waiting 18 s" in line, line


def test_a_record_an_older_orchestrator_wrote_gets_the_same_phases() -> None:
    """Before SLURM's jobs were attempts, status.json listed them as `segments`, each
    numbered `segment`: its queue waits and attempts are read from there all the same."""
    older = [{"segment": 1, **SLURM_JOBS[0]}, {"segment": 2, **SLURM_JOBS[1]}]
    for entry in older:
        del entry["attempt"]
    found = phases_of({"segments": older}, slurm_records(), 85)
    assert [a["attempt"] for a in found.attempts] == [1, 2]
    assert found.phases["waiting"] == pytest.approx(18.0)
    assert found.to_dict() == phases_of({"attempts": SLURM_JOBS}, slurm_records(), 85).to_dict()


def test_a_record_without_attempts_is_one_attempt_from_the_start() -> None:
    records = [progress(10, 0, 5), mark(10.5, checkpoint=5, save_s=0.5)]
    found = phases_of({"nnodes": 1}, records, 12)
    only(found.phases, starting=5, training=5, checkpoints=0.5, stopping=1.5)


def test_marks_are_told_from_progress() -> None:
    assert is_mark({"checkpoint": 10, "save_s": 0.1}) and is_mark({"from_step": 3})
    assert not is_mark({"step": 10, "checkpoint": 10}) and not is_mark({"loss": 1.0})


def test_no_start_time_is_no_goodput() -> None:
    assert inputs_of({"state": "running"}, []) is None


@pytest.mark.parametrize(
    "seconds, text",
    [(0.04, "0.0 s"), (4.25, "4.2 s"), (9.96, "10 s"), (38.4, "38 s"), (180, "3 min"),
     (192, "3 min 12 s"), (7500, "2 h 5 min")],
)  # fmt: skip
def test_durations_read_as_the_line_says_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_the_line_and_the_table_say_the_records_figures() -> None:
    status, records = lost_node_run()
    kept = phases_of(status, records, 95).to_dict()
    line = goodput_line(kept)
    assert line == (
        "goodput 46 %: 34 s lost to 1 fault (detect 5.0 s, restart 25 s, redone 4.0 s; "
        "5 step(s) redone)"
    )
    table = goodput_table(kept)
    assert table[0] == f"  {line}"
    assert table[1].split() == ["PHASE", "ATTEMPT", "1", "ATTEMPT", "2", "TOTAL", "SHARE"]
    training = next(r for r in table if "training kept" in r).split()
    assert training[-5:] == ["19.0", "25.0", "44.0", "46.3", "%"]
    assert table[-1].split()[:4] == ["wall", "60.0", "35.0", "95.0"]


def test_without_faults_the_line_says_where_the_rest_went() -> None:
    records = [progress(10, 0, 5), mark(10.5, checkpoint=5, save_s=0.5)]
    kept = phases_of({"nnodes": 1}, records, 12).to_dict()
    assert goodput_line(kept) == (
        "goodput 42 %: training 5.0 s kept of 12 s (starting 5.0 s, checkpoint saves 0.5 s, "
        "stopping 1.5 s)"
    )


def test_the_from_step_mark_says_when_training_began_where_records_cover_less() -> None:
    # A short run: its one record covers the last 20 of its 200 steps (the progress line's
    # window); the mark says training began at 10 s, after 0 steps.
    last = progress(30, 0, 200, steps=20)
    last["metrics"]["step_s"] = 0.5  # its 20 steps took 10 s
    found = phases_of({"nnodes": 1}, [mark(10, from_step=0), last], 31)
    only(found.phases, starting=10, training=20, stopping=1)
    assert found.attempts[0]["steps"] == [0, 200]
    without = phases_of({"nnodes": 1}, [last], 31)
    only(without.phases, starting=20, training=10, stopping=1)
    assert without.attempts[0]["steps"] == [180, 200]


def test_a_slurm_job_ended_by_a_node_failure_is_a_fault_where_no_event_says_so() -> None:
    attempts = [
        {"attempt": 1, "submitted_at": at(0), "running_at": at(5), "ended_at": at(40),
         "ended": "node-failure"},
        {"attempt": 2, "submitted_at": at(45), "running_at": at(50), "ended": "completed"},
    ]  # fmt: skip
    records = [mark(10, from_step=0), progress(15, 0, 5), progress(20, 0, 10)]
    records += [mark(20.5, checkpoint=10, save_s=0.5), progress(25, 0, 15)]
    records += [mark(55, from_step=10), progress(60, 0, 15), progress(65, 0, 20)]
    found = phases_of({"attempts": attempts}, records, 70)
    first, second = found.attempts
    only(
        first["phases"],
        waiting=5, starting=5, training=10, checkpoints=0.5, redone=4.5, detecting=15, stopping=5,
    )  # fmt: skip
    only(second["phases"], waiting=5, starting=5, training=10, stopping=5)
    (fault,) = found.faults
    assert (fault.event, fault.detect_s, fault.restart_s) == ("node-failure", 15.0, 15.0)
    assert fault.redone_s == pytest.approx(4.5) and found.redone_steps == 5


def test_a_recovery_says_when_the_fault_was_seen_where_no_event_does() -> None:
    status, records = lost_node_run()
    records = [r for r in records if r.get("event") != "lost"]
    status["recoveries"] = [{"attempt": 2, "noticed_at": at(41)}]
    (fault,) = phases_of(status, records, 95).faults
    assert (fault.event, fault.detect_s) == ("node-failure", 6.0)


def test_marks_alone_say_where_training_was() -> None:
    # A node lost right after the first checkpoint, before any record of steps was due.
    records = [mark(10, from_step=0), mark(12, checkpoint=10, save_s=0.5)]
    records += [event(16, "lost", "b"), event(18, "end", "a"), mark(25, from_step=10)]
    records += [progress(30, 0, 15), event(31, "end", "a")]
    found = phases_of({"world": world((1, 0, 2), (2, 20, 2))}, records, 32)
    only(
        found.attempts[0]["phases"], starting=10, training=1.5, checkpoints=0.5, detecting=4,
        stopping=4,
    )  # fmt: skip
    assert found.attempts[0]["steps"] == [0, 10] and found.redone_steps == 0
    (fault,) = found.faults
    assert (fault.detect_s, fault.restart_s) == (4.0, 9.0)


def test_a_slow_node_swapped_costs_its_restart_only() -> None:
    """Node c is slow; it is taken out at 28 s (its `swap` event): the ranks checkpoint at
    step 20 (30 s) and end; attempt 2 on the spare resumes from step 20."""
    records = [mark(10, from_step=0)]
    for when, step in ((15, 5), (20, 10), (25, 15), (30, 20)):
        records += [progress(when, r, step, "abc"[r]) for r in range(3)]
    records += [event(28, "swap", "c", "slow: rank 2's step work 3.0x the median for 20 s")]
    records += [mark(31, checkpoint=20, save_s=1.0)]
    records += [event(32, "end", h) for h in "abc"] + [event(45, "start", h) for h in "abd"]
    records.append(mark(48, from_step=20))
    for when, step in ((53, 25), (58, 30)):
        records += [progress(when, r, step, "abd"[r]) for r in range(3)]
    recovery = {"attempt": 2, "node": "c", "spare": "d", "noticed_at": at(28)}
    status = {"world": world((1, 1, 3), (2, 40, 3)), "recoveries": [recovery]}
    found = phases_of(status, records, 60)
    (fault,) = found.faults
    assert (fault.event, fault.detect_s, fault.redone_s) == ("swap", 0.0, 0.0)
    assert found.redone_steps == 0 and fault.restart_s == pytest.approx(17.0)  # 31 s -> 48 s
    assert goodput_line(found.to_dict()) == (
        "goodput 50 %: 17 s lost to 1 slow node swapped (detect 0.0 s, restart 17 s, redone "
        "0.0 s; 0 step(s) redone)"
    )
