"""The trainer's per-rank records on ORCHESTRATOR_METRICS_FILE, under real torchrun."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from orchestrator.trainer.channel import ENV
from tests.trainer_helpers import FAST, PYTHON, kill_group, run_trainer, trainer_env, wait_for

KEYS = {"step", "loss", "samples_per_s", "step_s", "data_wait_s", "work_s", "sync_s", "steps",
        "time"}  # fmt: skip


def channel_env() -> dict[str, str]:
    env = trainer_env()
    env.pop(ENV, None)
    return env


def per_rank_torchrun(directory: Path, args: Sequence[str]) -> list[str]:
    """torchrun hands every rank the same environment; a wrapper gives each its own file.

    The trainer replaces the shell (exec), so each rank's pid is the trainer's.
    """
    target = shlex.quote(str(directory / "metrics-"))
    script = f'{ENV}={target}"$RANK.jsonl" exec "$0" -m orchestrator.trainer "$@"'
    return [
        PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "--no-python", "bash", "-c", script, PYTHON, *args,
    ]  # fmt: skip


def run_per_rank(directory: Path, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        per_rank_torchrun(directory, args),
        capture_output=True,
        text=True,
        timeout=180,
        env=channel_env(),
    )


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def read_records(path: Path) -> list[dict]:
    """The records of steps: what rank 0 writes besides them are marks (check_marks)."""
    return [record for record in read_lines(path) if "step" in record]


def check_marks(lines: list[dict], rank: int) -> None:
    """Rank 0 marks the start of training (from_step 0) before its first record; the other
    ranks write no mark."""
    marks = [line for line in lines if "step" not in line]
    if rank != 0:
        assert marks == [], marks
        return
    assert marks == [{"from_step": 0, "time": marks[0]["time"]}], marks
    first = next(line for line in lines if "step" in line)
    assert lines[0] is marks[0] and marks[0]["time"] <= first["time"], lines[:2]


def check_records(
    records: list[dict], first_step: int, last_step: int, log_every: int | None = None
) -> None:
    """Complete, consistent records, none counting a step twice: each covers the steps
    since the previous record, or since a later progress line (every `log_every` steps)."""
    assert records, "no records"
    for record in records:
        assert set(record) == KEYS, record
        assert isinstance(record["step"], int) and isinstance(record["steps"], int)
        for key in KEYS - {"step", "steps"}:
            assert math.isfinite(record[key]) and record[key] >= 0, (key, record)
        assert record["steps"] >= 1 and record["samples_per_s"] > 0, record
        assert math.isclose(record["work_s"] + record["sync_s"], record["step_s"], rel_tol=1e-9)
        assert record["data_wait_s"] <= record["work_s"] + 1e-9, record
    steps = [r["step"] for r in records]
    assert steps == sorted(set(steps)), steps  # strictly increasing
    assert steps[-1] == last_step
    for record, before in zip(records, [first_step, *steps[:-1]], strict=True):
        start = record["step"] - record["steps"]
        since_line = bool(log_every) and start > before and start % log_every == 0
        assert start == before or since_line, (before, record)
    # At most one record a second, the last step's own record aside.
    times = [r["time"] for r in records]
    assert all(b - a >= 0.95 for a, b in zip(times[:-2], times[1:-1], strict=True)), times


def test_every_rank_records_its_own_steps(tmp_path: Path) -> None:
    args = [*FAST, "--batch-size", "8", "--grad-accum", "2", "--max-steps", "800",
            "--epochs", "1000", "--log-every", "7"]  # fmt: skip
    result = run_per_rank(tmp_path, args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "done: 800 steps" in result.stdout
    assert ENV not in result.stderr
    for rank in (0, 1):
        check_marks(read_lines(tmp_path / f"metrics-{rank}.jsonl"), rank)
        records = read_records(tmp_path / f"metrics-{rank}.jsonl")
        check_records(records, 0, 800, log_every=7)
        assert len(records) >= 2, records  # 800 steps take more than a second here
        assert records[-1]["steps"] <= 800 % 7, records[-1]  # the last progress line's window
        # Two ranks: DDP's all-reduce is waited for, at least a little, on every step.
        assert all(r["sync_s"] > 0 for r in records), records
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics-0.jsonl", "metrics-1.jsonl"]


def test_alone_there_is_no_sync(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"left": "by an earlier program"}\n')  # appended to, never truncated
    env = channel_env()
    env[ENV] = str(path)
    result = run_trainer([*FAST, "--batch-size", "8", "--max-steps", "30"], env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = path.read_text().splitlines()
    assert lines[0] == '{"left": "by an earlier program"}'
    check_marks([json.loads(line) for line in lines[1:]], 0)
    records = [json.loads(line) for line in lines[1:] if '"step"' in line]
    check_records(records, 0, 30, log_every=3)  # the default: a tenth of the steps
    assert all(r["sync_s"] == 0 and r["work_s"] == r["step_s"] for r in records)


def test_without_the_variable_nothing_is_written(tmp_path: Path) -> None:
    result = subprocess.run(
        [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "orchestrator.trainer", *FAST, "--max-steps", "5"],
        capture_output=True, text=True, timeout=180, env=channel_env(), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_path_warns_and_training_goes_on(tmp_path: Path) -> None:
    missing = tmp_path / "missing"  # the orchestrator creates the directory; nobody did
    result = run_per_rank(missing, [*FAST, "--max-steps", "5"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "done: 5 steps" in result.stdout
    for rank in (0, 1):
        line = (
            f"warning: cannot write {ENV} {missing}/metrics-{rank}.jsonl: No such file or "
            "directory; training goes on without metrics"
        )
        assert result.stderr.count(line) == 1, result.stderr
    assert not missing.exists()


def test_a_slowed_rank_shows_more_work_and_the_same_step_time(tmp_path: Path) -> None:
    """Stop rank 1 in bursts from outside: it, not rank 0, has the large work_s."""
    out = tmp_path / "out.txt"
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    # Big batches: the more of a step is compute, the more stops land in rank 1's work (on
    # a loaded 2-core machine gloo's all-reduce of even a small model takes milliseconds).
    args = [*FAST, "--synthetic-samples", "4096", "--batch-size", "256",
            "--max-steps", "1000000", "--epochs", "100000", "--log-every", "1000000"]  # fmt: skip
    with out.open("w") as stdout:
        proc = subprocess.Popen(
            per_rank_torchrun(metrics, args), stdout=stdout, stderr=subprocess.STDOUT,
            env=channel_env(), start_new_session=True, text=True,
        )  # fmt: skip
    slowed = 0
    try:
        wait_for(lambda: "rank 1/2 started: pid " in out.read_text(), 120, "rank 1 to start")
        slowed = int(out.read_text().split("rank 1/2 started: pid ")[1].split(",")[0])
        files = [metrics / f"metrics-{rank}.jsonl" for rank in (0, 1)]
        wait_for(lambda: all(f.exists() and f.read_text() for f in files), 120, "records")
        began = time.time()
        while time.time() - began < 8:
            os.kill(slowed, signal.SIGSTOP)
            time.sleep(0.3)
            os.kill(slowed, signal.SIGCONT)
            time.sleep(0.1)
        ended = time.time()
        kill_group(proc, signal.SIGTERM)  # an agreed stop: each rank records its last step
        proc.wait(timeout=120)
    finally:
        if slowed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(slowed, signal.SIGCONT)
        kill_group(proc, signal.SIGKILL)
        proc.wait()
    ranks = [read_records(f) for f in files]
    for records in ranks:
        check_records(records, 0, ranks[0][-1]["step"])  # both stopped after the same step

    def during(records: list[dict], key: str) -> float:
        # Records whose whole second lies inside the bursts.
        inside = [r[key] for r in records if began + 1.2 <= r["time"] <= ended]
        assert len(inside) >= 3, records
        return statistics.mean(inside)

    work = [during(records, "work_s") for records in ranks]
    step = [during(records, "step_s") for records in ranks]
    seen = f"work_s {work}, step_s {step}"
    assert work[1] >= 1.5 * work[0], seen
    assert 0.8 <= step[1] / step[0] <= 1.25, seen
