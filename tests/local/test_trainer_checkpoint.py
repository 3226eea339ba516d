"""Atomic checkpoints, and stopping cleanly on SIGTERM/SIGUSR1 without hanging."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from orchestrator.trainer.checkpoint import (
    LATEST_POINTER,
    SLOW_SAVE_ENV,
    find_latest,
    load_checkpoint,
    remove_stale_temporaries,
    save_checkpoint,
)
from orchestrator.trainer.exits import CheckpointError
from tests.trainer_helpers import (
    FAST,
    TRAINER,
    kill_group,
    run_trainer,
    start_ranks,
    torchrun_command,
    trainer_env,
    wait_all,
    wait_for,
)

# Long enough never to finish during a test; the tests stop it.
FOREVER = ["--epochs", "100000", "--log-every", "10", "--batch-size", "4"]


def _state(step: int) -> dict:
    return {
        "format": "orchestrator.trainer/1",
        "step": step,
        "epoch": 0,
        "step_in_epoch": step,
        "model": {"w": torch.full((2,), float(step))},
        "optimizer": {},
        "run": {},
        "rng": [],
    }


def test_save_points_latest_at_the_newest_and_prunes(tmp_path: Path) -> None:
    for step in (5, 10, 15, 20):
        save_checkpoint(tmp_path, _state(step), keep=2)
    assert (tmp_path / LATEST_POINTER).read_text() == "ckpt-00000020.pt\n"
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == [
        "ckpt-00000015.pt", "ckpt-00000020.pt"
    ]  # fmt: skip
    assert load_checkpoint(find_latest(tmp_path))["step"] == 20
    # Without a pointer the highest step wins.
    (tmp_path / LATEST_POINTER).unlink()
    assert find_latest(tmp_path).name == "ckpt-00000020.pt"
    assert not list(tmp_path.glob(".*.tmp"))


def test_stale_temporaries_are_removed_and_truncated_files_rejected(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, _state(5), keep=0)
    truncated = tmp_path / ".ckpt-00000010.pt.1234.tmp"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    unrelated = tmp_path / "notes.tmp"
    unrelated.write_text("mine")
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(truncated)
    assert remove_stale_temporaries(tmp_path) == [truncated]
    assert unrelated.exists()


def test_sigkill_during_a_save_leaves_the_latest_checkpoint_loadable(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    # Test hook: every checkpoint write pauses 2 s after its first chunk.
    proc = subprocess.Popen(
        [*TRAINER, *FAST, *FOREVER, "--checkpoint-every", "5", "--checkpoint-dir",
         str(directory)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=trainer_env(**{SLOW_SAVE_ENV: "2"}),
    )  # fmt: skip
    try:
        wait_for(lambda: (directory / LATEST_POINTER).exists(), 60, "the first checkpoint")
        # The second save is under way once its temporary file appears.
        wait_for(lambda: any(directory.glob(".ckpt-00000010.pt.*.tmp")), 30, "the second save")
        proc.kill()
    finally:
        proc.kill()
        proc.wait(timeout=30)
    partial = next(directory.glob(".ckpt-00000010.pt.*.tmp"))
    with pytest.raises(CheckpointError):
        load_checkpoint(partial)  # the kill really hit mid-write
    assert not (directory / "ckpt-00000010.pt").exists()
    latest = find_latest(directory)
    assert latest.name == "ckpt-00000005.pt"
    assert load_checkpoint(latest)["step"] == 5

    result = run_trainer([*FAST, "--batch-size", "4", "--max-steps", "12",
                          "--checkpoint-dir", str(directory), "--resume"])  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "at step 5" in result.stdout
    assert not partial.exists()
    assert load_checkpoint(find_latest(directory))["step"] == 12


def _stop_lines(text: str) -> list[tuple[str, int]]:
    return [(m[0], int(m[1])) for m in re.findall(r"stopped by (\w+) after step (\d+)", text)]


def test_sigusr1_to_one_rank_stops_all_ranks_at_the_same_step(tmp_path: Path) -> None:
    directory, logs = tmp_path / "ckpt", tmp_path / "logs"
    procs = start_ranks(
        2, [*FAST, *FOREVER, "--checkpoint-dir", str(directory)], tmp_path / "rdzv", logs
    )
    try:
        wait_for(lambda: "step 10/" in (logs / "rank0.out").read_text(), 60, "training")
        procs[1].send_signal(signal.SIGUSR1)  # rank 0 never sees a signal
        codes = wait_all(procs, timeout=60)
    finally:
        for proc in procs:
            proc.kill()
    assert codes == [128 + signal.SIGUSR1] * 2
    out0, out1 = ((logs / f"rank{r}.out").read_text() for r in (0, 1))
    (name0, step0), (name1, step1) = _stop_lines(out0) + _stop_lines(out1)
    assert name0 == name1 == "SIGUSR1" and step0 == step1 >= 10
    assert f"checkpoint saved to {directory / f'ckpt-{step0:08d}.pt'}" in out0
    assert load_checkpoint(find_latest(directory))["step"] == step0
    for rank in (0, 1):
        assert (logs / f"rank{rank}.err").read_text() == ""


def test_sigterm_to_a_torchrun_job_checkpoints_and_exits(tmp_path: Path) -> None:
    directory, logs = tmp_path / "ckpt", tmp_path / "logs"
    # Like the orchestrator stopping a job: SIGTERM to torchrun's whole process group.
    proc = subprocess.Popen(
        torchrun_command(2, [*FAST, *FOREVER, "--checkpoint-dir", str(directory)],
                         "--log-dir", str(logs), "--redirects", "3"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=trainer_env(),
        start_new_session=True,
    )  # fmt: skip
    try:

        def rank_output(rank: int, stream: str = "stdout") -> str:
            files = list(logs.rglob(f"attempt_0/{rank}/{stream}.log"))
            return files[0].read_text() if files else ""

        wait_for(lambda: "step 10/" in rank_output(0), 60, "training")
        kill_group(proc, signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        kill_group(proc, signal.SIGKILL)
        proc.wait()
    (_, step0), (_, step1) = _stop_lines(rank_output(0)) + _stop_lines(rank_output(1))
    assert step0 == step1
    assert load_checkpoint(find_latest(directory))["step"] == step0
    for rank in (0, 1):
        assert "Traceback" not in rank_output(rank, "stderr")


def test_sigterm_without_checkpoint_dir_still_exits_cleanly(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*TRAINER, *FAST, *FOREVER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=trainer_env(),
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("step "):
                break
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    assert "no --checkpoint-dir, so nothing was saved" in out
    assert err == ""
