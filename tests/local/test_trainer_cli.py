"""The trainer's command line: --help, and bad input failing cleanly with exit code 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from orchestrator.trainer.checkpoint import load_checkpoint
from orchestrator.trainer.config import TrainConfig, resolve_topology
from orchestrator.trainer.entry import build_parser
from orchestrator.trainer.exits import TrainerUsageError
from orchestrator.trainer.models import build_model
from orchestrator.trainer.setup import autocast_factory
from tests.trainer_helpers import (
    FAST,
    assert_clean_failure,
    load_weights,
    run_torchrun,
    run_trainer,
)


def test_help_explains_every_option() -> None:
    result = run_trainer(["--help"])
    assert result.returncode == 0, result.stderr
    for action in build_parser()._actions:
        for flag in action.option_strings:
            assert flag in result.stdout, flag
        if action.option_strings and action.dest != "help":
            assert action.help, f"{action.option_strings} has no help text"
    for documented in ("exit codes", "143", "SIGUSR1", "done:", "data_wait", "{rank}"):
        assert documented in result.stdout, documented


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--batch-size", "0"], ["--batch-size 0", "positive"]),
        (["--lr", "-0.1"], ["--lr -0.1", "positive"]),
        (["--model", "resnet"], ["--model resnet", "mlp, cnn"]),
        (["--grad-accum", "two"], ["--grad-accum", "'two'"]),
        (
            ["--dataset", "cifar10", "--data-path", "/nonexistent/cifar"],
            ["--data-path /nonexistent/cifar", "no such directory"],
        ),
        (
            ["--dataset", "npz", "--data-path", "/nonexistent/d.npz"],
            ["--data-path /nonexistent/d.npz", "no such file"],
        ),
        (["--dataset", "cifar10"], ["--dataset cifar10 needs --data-path"]),
        (["--resume"], ["--resume", "--checkpoint-dir"]),
        (["--precision", "fp8"], ["--precision fp8", "fp32, bf16, fp16"]),
        (["--init-method", "tcp://127.0.0.1:1"], ["--init-method", "--rank"]),
        (["--rank", "1"], ["--rank/--world-size", "--init-method"]),
        (["--metrics", "m-{node}.jsonl"], ["--metrics m-{node}.jsonl", "{rank}"]),
        (["--timeout", "0"], ["--timeout 0", "positive number of seconds"]),
        (["--local-rank", "0", "--local-world-size", "1"], ["--local-rank", "--init-method"]),
        (
            ["--global-batch", "64", "--grad-accum", "2"],
            ["--global-batch 64 with --grad-accum 2", "give one of the two"],
        ),
    ],
)
def test_bad_option_values_exit_2_with_one_line(args: list[str], needles: list[str]) -> None:
    assert_clean_failure(run_trainer(args, timeout=60), *needles)


def test_errors_found_after_torch_import_also_exit_2(tmp_path: Path) -> None:
    corrupt = tmp_path / "ckpt-00000010.pt"
    corrupt.write_bytes(b"PK\x03\x04 this is not a checkpoint")
    assert_clean_failure(
        run_trainer([*FAST, "--resume", str(corrupt)]), f"--resume {corrupt}", "corrupt"
    )


def test_setup_errors_that_need_torch_name_the_option() -> None:
    # Checked in-process: the CLI path for such errors is the corrupt-checkpoint case.
    with pytest.raises(TrainerUsageError, match="--precision fp16 needs a CUDA device"):
        autocast_factory("fp16", torch.device("cpu"))
    with pytest.raises(TrainerUsageError, match="--model cnn expects 3x32x32 images"):
        build_model("cnn", (64,), 10)
    with pytest.raises(TrainerUsageError, match="no such file on rank 0's node"):
        load_checkpoint(Path("/nonexistent/ckpt.pt"))


def test_under_torchrun_every_rank_exits_2_without_traceback(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    # Polling only every 2 s lets both ranks finish before torchrun reacts to the first
    # exit (it would otherwise SIGTERM the slower rank).
    result = run_torchrun(
        2, ["--batch-size", "0"], "--log-dir", str(logs), "--redirects", "3",
        "--monitor-interval", "2",
    )  # fmt: skip
    assert result.returncode != 0
    # torchrun's own failure report names the ranks' exit code.
    assert "exitcode  : 2" in result.stderr, result.stderr
    rank_errors = sorted(logs.rglob("stderr.log"))
    assert len(rank_errors) == 2
    for path in rank_errors:
        text = path.read_text()
        assert "Traceback" not in text, text
        assert text.strip() == (
            "python -m orchestrator.trainer: error: --batch-size 0: must be a positive "
            "integer; e.g. --batch-size 32"
        )


def test_topology_from_torchrun_environment() -> None:
    env = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
    }
    topo = resolve_topology(env, None, None, None)
    assert (topo.rank, topo.world_size, topo.local_rank, topo.local_world_size) == (3, 4, 1, 2)
    assert topo.init_method == "env://" and topo.launcher == "torchrun"
    alone = resolve_topology({}, None, None, None)
    assert (alone.world_size, alone.init_method, alone.launcher) == (1, None, "single")
    explicit = resolve_topology({}, "tcp://h:1234", 1, 2)
    assert (explicit.rank, explicit.world_size, explicit.init_method) == (1, 2, "tcp://h:1234")
    with pytest.raises(TrainerUsageError, match="MASTER_PORT"):
        resolve_topology({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, None, None, None)
    with pytest.raises(TrainerUsageError, match="need 0 <= rank < world size"):
        resolve_topology({}, "tcp://h:1", 2, 2)


def test_local_placement_with_init_method_from_flags_env_or_derived() -> None:
    derived = resolve_topology({}, "tcp://h:1234", 1, 2)
    assert (derived.local_rank, derived.local_world_size) == (None, None)
    from_env = resolve_topology({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, "tcp://h:1", 1, 2)
    assert (from_env.local_rank, from_env.local_world_size) == (1, 2)
    flags = resolve_topology({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, "tcp://h:1", 1, 4, 0, 1)
    assert (flags.local_rank, flags.local_world_size) == (0, 1)  # flags win
    with pytest.raises(TrainerUsageError, match="go together"):
        resolve_topology({}, "tcp://h:1", 1, 2, 1, None)
    with pytest.raises(TrainerUsageError, match="--local-rank 2 --local-world-size 2"):
        resolve_topology({}, "tcp://h:1", 1, 2, 2, 2)
    with pytest.raises(TrainerUsageError, match="only used with --init-method"):
        resolve_topology({}, None, None, None, 0, 1)


def test_config_rejects_what_the_cli_would() -> None:
    assert TrainConfig().lr > 0  # the defaults themselves are valid
    with pytest.raises(TrainerUsageError, match="--checkpoint-every 5 needs --checkpoint-dir"):
        TrainConfig(checkpoint_every=5)
    with pytest.raises(TrainerUsageError, match="--max-steps 0"):
        TrainConfig(max_steps=0)
    with pytest.raises(TrainerUsageError, match="--lr nan"):
        TrainConfig(lr=float("nan"))


PROGRESS = re.compile(
    r"^step (\d+)/200 epoch [12]/2 loss (\d+\.\d{4}) samples/s \d+ step_ms \d+\.\d\d "
    r"data_wait \d+\.\d%$"
)
SUMMARY = re.compile(
    r"^done: 200 steps, final loss (\d+\.\d{4}), test acc (\d+\.\d)%, \d+ samples/s, "
    r"data wait \d+\.\d%, train \d+\.\d s, total \d+\.\d s$"
)


def test_default_run_under_torchrun_shows_a_falling_loss() -> None:
    # Exactly what `orchestrator launch` runs by default: no arguments at all.
    result = run_torchrun(2, [])
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    progress = [m for m in map(PROGRESS.match, lines) if m]
    # Rank 0 alone reports: ten lines, not twenty.
    assert [int(m[1]) for m in progress] == list(range(20, 201, 20))
    losses = [float(m[2]) for m in progress]
    assert losses[0] > 1.0 and losses[-1] < 0.3 and losses[-1] < losses[0] / 5
    summary = [m for m in map(SUMMARY.match, lines) if m]
    assert len(summary) == 1 and float(summary[0][1]) == losses[-1]
    assert float(summary[0][2]) > 90  # test accuracy, percent
    assert {"rank 0/2 started", "rank 1/2 started"} <= {line[:16] for line in lines}, lines
    assert "Traceback" not in result.stderr


def test_bf16_on_cpu_trains_and_evaluates_through_the_cli(tmp_path: Path) -> None:
    # CPU autocast runs bf16 everywhere, if slowly without native support.
    out = tmp_path / "ckpt"
    result = run_trainer(
        ["--synthetic-samples", "512", "--precision", "bf16", "--batch-size", "16",
         "--max-steps", "30", "--log-every", "10", "--checkpoint-dir", str(out),
         "--device", "cpu"],
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "; bf16" in result.stdout.splitlines()[1], result.stdout
    losses = [float(m) for m in re.findall(r"^step \d+/30 .* loss (\d+\.\d+)", result.stdout, re.M)]
    assert len(losses) == 3 and losses[-1] < losses[0], result.stdout
    assert re.search(r"^done: 30 steps, final loss [\d.]+, test acc [\d.]+%", result.stdout, re.M)
    # Autocast changes the compute dtype only: saved weights stay fp32.
    assert {t.dtype for t in load_weights(out / "final.pt").values()} == {torch.float32}
