"""The trainer's validated settings and process topology (pure: no torch import).

Whatever can be checked without torch is checked here, before torch is imported, so a
typo costs a tenth of a second instead of three. Problems only the data or a checkpoint
reveal are found later, in ``setup``, and reported the same way (exit code 2).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from orchestrator.trainer.exits import TrainerUsageError

MODELS = ("mlp", "cnn")
DATASETS = ("synthetic", "cifar10", "npz")
PRECISIONS = ("fp32", "bf16", "fp16")
DEVICES = ("auto", "cpu", "cuda")
RESUME_LATEST = "latest"
# torchrun exports all four; their presence means "initialise from the environment".
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# Set by the orchestrator on every rank: the number of ranks the run was launched with.
# When it differs from this world (the run went on after losing a node), the trainer
# keeps the launch's global batch (split.py).
LAUNCH_WORLD_SIZE_ENV = "ORCHESTRATOR_LAUNCH_WORLD_SIZE"


@dataclass(frozen=True)
class TrainConfig:
    """One training run, as the user asked for it (already validated)."""

    model: str = "mlp"
    dataset: str = "synthetic"
    data_path: Path | None = None
    synthetic_samples: int = 6400
    batch_size: int = 32
    grad_accum: int = 1
    # Samples per optimizer step whatever the world size; None: world x batch x accum.
    global_batch: int | None = None
    epochs: int = 2
    max_steps: int | None = None
    lr: float = 0.01
    momentum: float = 0.9
    seed: int = 0
    precision: str = "fp32"
    device: str = "auto"
    checkpoint_dir: Path | None = None
    checkpoint_every: int = 0
    keep_checkpoints: int = 3
    resume: str | None = None  # None, RESUME_LATEST, or a path
    metrics: str | None = None
    log_every: int | None = None
    stop_check_every: int | None = None  # None: adaptive, about every 0.25 s
    evaluate: bool = True
    cuda_graphs: bool = True  # where they apply (graphs.py)
    # Seconds any rendezvous or collective may wait for a peer before this rank gives up
    # (exit 1): the bound on how long a silent peer (hung, stopped, cut off) can hold
    # the others. A peer that exits is noticed at once on gloo.
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        _check_choice("--model", self.model, MODELS)
        _check_choice("--dataset", self.dataset, DATASETS)
        _check_choice("--precision", self.precision, PRECISIONS)
        _check_choice("--device", self.device, DEVICES)
        _check_positive("--batch-size", self.batch_size, "e.g. --batch-size 32")
        _check_positive("--grad-accum", self.grad_accum, "use 1 for no accumulation")
        _check_positive("--epochs", self.epochs, "e.g. --epochs 2")
        if self.global_batch is not None:
            _check_positive("--global-batch", self.global_batch, "e.g. --global-batch 128")
            if self.grad_accum != 1:
                raise TrainerUsageError(
                    f"--global-batch {self.global_batch} with --grad-accum {self.grad_accum}: "
                    "--global-batch sets the accumulation itself (micro-batches of at most "
                    "--batch-size); give one of the two"
                )
        _check_positive("--synthetic-samples", self.synthetic_samples, "e.g. 6400")
        if self.stop_check_every is not None:
            _check_positive("--stop-check-every", self.stop_check_every, "1 checks every step")
        if self.max_steps is not None:
            _check_positive("--max-steps", self.max_steps, "or leave it out to run --epochs")
        if self.log_every is not None:
            _check_positive("--log-every", self.log_every, "e.g. --log-every 20")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise TrainerUsageError(
                f"--timeout {self.timeout_s:g}: must be a positive number of seconds, "
                "e.g. --timeout 300"
            )
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise TrainerUsageError(
                f"--lr {self.lr}: the learning rate must be a positive number, e.g. --lr 0.05"
            )
        if not (math.isfinite(self.momentum) and 0 <= self.momentum < 1):
            raise TrainerUsageError(
                f"--momentum {self.momentum}: must be in [0, 1), e.g. --momentum 0.9"
            )
        if self.seed < 0:
            raise TrainerUsageError(f"--seed {self.seed}: must be >= 0")
        if self.checkpoint_every < 0:
            raise TrainerUsageError(
                f"--checkpoint-every {self.checkpoint_every}: must be >= 0 "
                "(0 saves only at the end and on a stop signal)"
            )
        if self.keep_checkpoints < 0:
            raise TrainerUsageError(
                f"--keep-checkpoints {self.keep_checkpoints}: must be >= 0 (0 keeps all)"
            )
        if self.checkpoint_every and self.checkpoint_dir is None:
            raise TrainerUsageError(
                f"--checkpoint-every {self.checkpoint_every} needs --checkpoint-dir DIR"
            )
        if self.resume == RESUME_LATEST and self.checkpoint_dir is None:
            raise TrainerUsageError(
                "--resume without a path resumes from the latest checkpoint in "
                "--checkpoint-dir; pass --checkpoint-dir DIR or --resume PATH"
            )
        self._check_data_path()
        self._check_paths()
        if self.metrics is not None:
            try:
                self.metrics.format(rank=0)
            except (KeyError, IndexError, ValueError):
                raise TrainerUsageError(
                    f"--metrics {self.metrics}: the only placeholder allowed is {{rank}}"
                ) from None

    def _check_data_path(self) -> None:
        if self.dataset == "synthetic":
            if self.data_path is not None:
                raise TrainerUsageError(
                    f"--data-path {self.data_path}: the synthetic dataset takes no path; "
                    "add --dataset cifar10 or --dataset npz"
                )
            return
        if self.data_path is None:
            raise TrainerUsageError(
                f"--dataset {self.dataset} needs --data-path "
                + (
                    "DIR (the extracted cifar-10-batches-py)"
                    if self.dataset == "cifar10"
                    else "FILE.npz"
                )
            )
        if self.dataset == "cifar10" and not self.data_path.is_dir():
            raise TrainerUsageError(
                f"--data-path {self.data_path}: no such directory; extract "
                "cifar-10-python.tar.gz and pass its cifar-10-batches-py directory"
            )
        if self.dataset == "npz" and not self.data_path.is_file():
            raise TrainerUsageError(
                f"--data-path {self.data_path}: no such file; pass an .npz file with "
                "arrays 'x' and 'y'"
            )

    def _check_paths(self) -> None:
        directory = self.checkpoint_dir
        if directory is not None and directory.exists() and not directory.is_dir():
            raise TrainerUsageError(
                f"--checkpoint-dir {self.checkpoint_dir}: exists and is not a directory"
            )
        # An explicit --resume PATH is checked by rank 0 alone when it loads the file:
        # on a multi-node job only rank 0's node needs to hold the checkpoints.

    @property
    def resume_path(self) -> Path | None:
        """The explicit checkpoint to resume from, if the user named one."""
        return None if self.resume in (None, RESUME_LATEST) else Path(self.resume)


def _check_choice(option: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise TrainerUsageError(f"{option} {value}: unknown; choose one of {', '.join(choices)}")


def _check_positive(option: str, value: int, hint: str) -> None:
    if value <= 0:
        raise TrainerUsageError(f"{option} {value}: must be a positive integer; {hint}")


@dataclass(frozen=True)
class Topology:
    """Where this process sits in the job and how it joins the process group.

    ``init_method`` is None for a plain single process (no process group at all).
    ``local_rank``/``local_world_size`` are None when ranks were started by hand without
    saying how they share nodes; the ranks then derive them from each other's host
    names when they meet (``placement.place_ranks``).
    """

    rank: int
    world_size: int
    local_rank: int | None
    local_world_size: int | None
    init_method: str | None
    launcher: str  # "torchrun", "explicit" or "single"
    # ORCHESTRATOR_LAUNCH_WORLD_SIZE: the ranks the run was launched with, if set.
    launch_world_size: int | None = None

    @property
    def is_distributed(self) -> bool:
        return self.init_method is not None


def resolve_topology(
    env: Mapping[str, str],
    init_method: str | None,
    rank: int | None,
    world_size: int | None,
    local_rank: int | None = None,
    local_world_size: int | None = None,
) -> Topology:
    """Decide how to initialise: torchrun's env://, an explicit --init-method, or alone."""
    topology = _resolve_topology(env, init_method, rank, world_size, local_rank, local_world_size)
    launch = _env_optional_int(env, LAUNCH_WORLD_SIZE_ENV)
    if launch is None:
        return topology
    if launch <= 0:
        raise TrainerUsageError(
            f"environment variable {LAUNCH_WORLD_SIZE_ENV}={launch}: must be the positive "
            "number of ranks the run was launched with; unset it for a fresh run"
        )
    return replace(topology, launch_world_size=launch)


def _resolve_topology(
    env: Mapping[str, str],
    init_method: str | None,
    rank: int | None,
    world_size: int | None,
    local_rank: int | None,
    local_world_size: int | None,
) -> Topology:
    if init_method is None and (local_rank is not None or local_world_size is not None):
        raise TrainerUsageError(
            "--local-rank/--local-world-size are only used with --init-method "
            "(torchrun sets LOCAL_RANK and LOCAL_WORLD_SIZE itself)"
        )
    if init_method is not None:
        if not init_method.startswith(("tcp://", "file://", "env://")):
            raise TrainerUsageError(
                f"--init-method {init_method}: use tcp://HOST:PORT or file:///shared/path"
            )
        if rank is None or world_size is None:
            raise TrainerUsageError(
                f"--init-method {init_method} needs --rank R and --world-size N"
            )
        if world_size <= 0 or not 0 <= rank < world_size:
            raise TrainerUsageError(
                f"--rank {rank} --world-size {world_size}: need 0 <= rank < world size"
            )
        _check_init_url(init_method)
        # Flags, then the environment (a job script may export them per node); neither:
        # derived from the ranks' host names once they meet.
        if local_rank is None:
            local_rank = _env_optional_int(env, "LOCAL_RANK")
        if local_world_size is None:
            local_world_size = _env_optional_int(env, "LOCAL_WORLD_SIZE")
        if (local_rank is None) != (local_world_size is None):
            raise TrainerUsageError(
                "--local-rank and --local-world-size (or LOCAL_RANK and LOCAL_WORLD_SIZE) "
                "go together; give both, or neither to derive them from the ranks' host names"
            )
        if (
            local_rank is not None
            and local_world_size is not None
            and not (0 <= local_rank < local_world_size <= world_size)
        ):
            raise TrainerUsageError(
                f"--local-rank {local_rank} --local-world-size {local_world_size}: need "
                f"0 <= local rank < local world size <= --world-size {world_size}"
            )
        return Topology(rank, world_size, local_rank, local_world_size, init_method, "explicit")
    if rank is not None or world_size is not None:
        raise TrainerUsageError(
            "--rank/--world-size are only used with --init-method tcp://HOST:PORT or file://PATH"
        )
    present = [name for name in TORCHRUN_ENV if name in env]
    if present and len(present) < len(TORCHRUN_ENV):
        missing = ", ".join(n for n in TORCHRUN_ENV if n not in env)
        raise TrainerUsageError(
            f"{', '.join(present)} set but {missing} not; run under torchrun, set all of "
            f"{', '.join(TORCHRUN_ENV)}, or pass --init-method"
        )
    if present:
        world = _env_int(env, "WORLD_SIZE", 1)
        rank_env = _env_int(env, "RANK", 0)
        return Topology(
            rank=rank_env,
            world_size=world,
            local_rank=_env_int(env, "LOCAL_RANK", 0),
            local_world_size=_env_int(env, "LOCAL_WORLD_SIZE", 1),
            init_method="env://",
            launcher="torchrun",
        )
    return Topology(0, 1, 0, 1, None, "single")


def _check_init_url(url: str) -> None:
    """Refuse what torch would only discover by waiting for its timeout (30 minutes).

    torch retries opening a file:// store whose directory is missing, silently, until
    the timeout, and a tcp:// URL without a port fails with a bare ValueError. Parsed
    as torch parses them: a file:// URL's path alone names the file.
    """
    parsed = urlsplit(url)
    if parsed.scheme == "tcp":
        try:
            port = parsed.port
        except ValueError:
            port = None
        if not parsed.hostname or not port:
            raise TrainerUsageError(
                f"--init-method {url}: needs a host and a port, e.g. tcp://node1:29500"
            )
    if parsed.scheme != "file":
        return
    if not parsed.path:
        raise TrainerUsageError(
            f"--init-method {url}: needs a file path, e.g. file:///shared/dir/rendezvous"
        )
    path = Path(parsed.path)
    if path.is_dir():
        raise TrainerUsageError(
            f"--init-method {url}: names a directory, not a file; use a file inside it "
            "that does not exist yet, e.g. file:///shared/dir/rendezvous"
        )
    if not path.parent.is_dir():
        raise TrainerUsageError(
            f"--init-method {url}: directory {path.parent} does not exist on this node; "
            "create it on a filesystem every rank sees, or use tcp://HOST:PORT"
        )
    if not os.access(path if path.exists() else path.parent, os.R_OK | os.W_OK):
        raise TrainerUsageError(
            f"--init-method {url}: cannot create or write {path} as this user; "
            "choose a writable shared directory"
        )


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    value = _env_optional_int(env, name)
    return default if value is None else value


def _env_optional_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    # Counted before int(), which raises past 4300 digits (the trainer stands alone: the
    # controller's orchestrator/numerals.py bounds its numbers the same way).
    if not re.fullmatch(r"\s*[+-]?[0-9]{1,18}\s*", raw):
        shown = repr(raw) if len(raw) <= 60 else f"{raw[:60]!r}… ({len(raw)} characters)"
        raise TrainerUsageError(
            f"environment variable {name}={shown} is not an integer of at most 18 digits"
        )
    return int(raw)
