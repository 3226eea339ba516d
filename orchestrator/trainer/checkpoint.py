"""Checkpoints that survive a kill at any moment, and resuming from them exactly.

Layout of a checkpoint directory::

    ckpt-00000040.pt   full training state after 40 optimizer steps
    latest             one line: the file name of the newest complete checkpoint
    final.pt           the trained model's plain state_dict (no DDP ``module.`` prefix)

Every file is written to a hidden temporary file in the same directory, flushed and
fsync'ed, then renamed over its final name (a rename within one filesystem is atomic),
and the directory is fsync'ed so the rename itself is durable. ``latest`` is updated the
same way and only after the checkpoint it names is complete, so a kill mid-write leaves
at worst a stray temporary file, which the next run removes.
"""

from __future__ import annotations

import os
import random
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from orchestrator.trainer.exits import CheckpointError

FORMAT = "orchestrator.trainer/1"
LATEST_POINTER = "latest"
FINAL_NAME = "final.pt"
REQUIRED_KEYS = ("format", "step", "epoch", "step_in_epoch", "model", "optimizer", "run", "rng")
_CHECKPOINT_RE = re.compile(r"ckpt-(\d+)\.pt")
_TEMP_RE = re.compile(r"\.(ckpt-\d+\.pt|final\.pt|latest)\.\d+\.tmp")
# Test hook, not a feature: seconds to pause after the first chunk of every checkpoint
# file is written, so a test can SIGKILL the trainer in the middle of a save.
SLOW_SAVE_ENV = "ORCHESTRATOR_TRAINER_TEST_SLOW_SAVE"


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:08d}.pt"


class _PausingWriter:
    """File wrapper for the test hook: pauses once, after the first chunk hits the disk."""

    def __init__(self, f: Any, pause_s: float) -> None:
        self._f = f
        self._pause_s = pause_s

    def write(self, data: bytes) -> int:
        written = self._f.write(data)
        if self._pause_s:
            self._f.flush()
            os.fsync(self._f.fileno())
            time.sleep(self._pause_s)
            self._pause_s = 0.0
        return written

    def flush(self) -> None:
        self._f.flush()


def _write_atomically(path: Path, write: Any) -> None:
    """Call ``write(file)`` on a temp file next to ``path``, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_torch_atomically(obj: object, path: Path) -> None:
    pause_s = float(os.environ.get(SLOW_SAVE_ENV, "0") or 0)

    def write(f: Any) -> None:
        torch.save(obj, _PausingWriter(f, pause_s) if pause_s else f)

    _write_atomically(path, write)


def save_checkpoint(directory: Path, state: dict[str, Any], keep: int) -> Path:
    """Write ``state`` as the checkpoint of its step, point ``latest`` at it, prune old ones."""
    path = directory / checkpoint_name(state["step"])
    save_torch_atomically(state, path)
    _write_atomically(directory / LATEST_POINTER, lambda f: f.write(f"{path.name}\n".encode()))
    if keep:
        # Oldest first by step; the file just written always stays, even when the run
        # resumed from an older checkpoint than some already in the directory.
        older = sorted(c for c in _checkpoints(directory) if c[1] != path)
        for _, old in older[: max(0, len(older) - (keep - 1))]:
            old.unlink(missing_ok=True)
    return path


def save_final_model(directory: Path, model_state: dict[str, torch.Tensor]) -> Path:
    path = directory / FINAL_NAME
    save_torch_atomically(model_state, path)
    return path


def _checkpoints(directory: Path) -> list[tuple[int, Path]]:
    found = []
    for p in directory.iterdir() if directory.is_dir() else ():
        match = _CHECKPOINT_RE.fullmatch(p.name)
        if match:
            found.append((int(match.group(1)), p))
    return found


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Delete temp files left by a save that was killed; returns what was removed."""
    removed = []
    for p in directory.iterdir() if directory.is_dir() else ():
        if _TEMP_RE.fullmatch(p.name):
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def find_latest(directory: Path) -> Path | None:
    """The checkpoint ``latest`` names; without a pointer, the highest-step ckpt file."""
    pointer = directory / LATEST_POINTER
    if pointer.is_file():
        try:
            name = pointer.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or exc.__class__.__name__
            raise CheckpointError(
                f"--resume: cannot read {pointer} ({reason}); fix or delete it, or pass "
                "--resume PATH"
            ) from None
        if not _CHECKPOINT_RE.fullmatch(name):
            raise CheckpointError(
                f"--resume: {pointer} holds {name!r}, not a checkpoint file name; "
                "delete it or pass --resume PATH"
            )
        return directory / name
    found = _checkpoints(directory)
    return max(found)[1] if found else None


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read and sanity-check a checkpoint; any problem is a CheckpointError (exit 2)."""
    if path.is_dir():
        raise CheckpointError(_directory_problem(path))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(
            f"--resume {path}: no such file on rank 0's node; pass a checkpoint file, or "
            "--resume alone to take the newest one in --checkpoint-dir"
        ) from None
    except PermissionError:
        raise CheckpointError(
            f"--resume {path}: permission denied reading it on rank 0's node; make it "
            "readable by this user, or pass another checkpoint"
        ) from None
    except OSError as exc:  # the file is fine as far as we know; reading it is not
        raise CheckpointError(
            f"--resume {path}: cannot read it on rank 0's node "
            f"({exc.strerror or exc.__class__.__name__})"
        ) from None
    except Exception as exc:  # torch/zipfile/pickle raise many types for a damaged file
        reason = (str(exc).strip().splitlines() or [""])[0][:160]
        raise CheckpointError(
            f"--resume {path}: cannot read the checkpoint ({exc.__class__.__name__}: "
            f"{reason}); it is corrupt or truncated, pass an older one with --resume PATH"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(
            f"--resume {path}: not a trainer checkpoint (no format {FORMAT!r}); a final.pt "
            "holds only model weights and cannot be resumed from"
        )
    missing = [key for key in REQUIRED_KEYS if key not in state]
    if missing:
        raise CheckpointError(f"--resume {path}: checkpoint lacks {', '.join(missing)}")
    return state


def _directory_problem(path: Path) -> str:
    try:
        newest = find_latest(path)
    except (CheckpointError, OSError):
        newest = None
    if newest is not None and newest.is_file():
        return (
            f"--resume {path}: is a checkpoint directory, not a checkpoint file; pass "
            f"--resume {newest} (its newest), or --checkpoint-dir {path} --resume"
        )
    return (
        f"--resume {path}: is a directory holding no checkpoints (ckpt-NNNNNNNN.pt); "
        "pass a checkpoint file"
    )


def check_compatible(path: Path, saved: dict[str, Any], current: dict[str, Any]) -> None:
    """Refuse to resume into a run whose model, data, seed or global batch differ."""
    for key, value in current.items():
        if saved.get(key) != value:
            # On fewer (or more) ranks by hand, --global-batch keeps the saved one.
            keep = f" or --global-batch {saved[key]}" if key == "global_batch" else ""
            raise CheckpointError(
                f"--resume {path}: checkpoint has {key}={saved.get(key)!r} but this run has "
                f"{key}={value!r}; resume with the same settings (any split of the same "
                f"global batch, world size x --batch-size x --grad-accum{keep}, is fine)"
            )


def capture_rng_state() -> dict[str, Any]:
    """Every RNG this process may draw from (torch CPU and CUDA, Python, NumPy)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached),
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
