"""What the trainer prints and records: rank-0 progress lines and per-rank JSON metrics.

Progress (stdout, rank 0 only, flushed per line because the launcher tails rank output
files line by line)::

    step 20/200 epoch 1/2 loss 1.2345 samples/s 10240 step_ms 6.25 data_wait 1.9%

``loss`` is the mean loss over every sample of every global batch since the previous
line (all ranks, all micro-steps), so it does not depend on how the batch is split.
``samples/s`` counts global samples, ``step_ms`` is wall time per optimizer step and
``data_wait`` the share of that time this rank spent gathering and copying batches
(host time: on CUDA the copy itself runs asynchronously).

Metrics (``--metrics FILE``): one JSON object per progress line. If FILE contains
``{rank}``, every rank writes its own file with that placeholder filled in; otherwise
only rank 0 writes FILE. Keys: step, epoch, rank, world_size, loss (global window
mean), rank_loss (this rank's own samples), samples_per_s, step_time_s, data_wait_s
(per step), data_wait_share, lr, time (Unix seconds).

The orchestrator's channel (``ORCHESTRATOR_METRICS_FILE``, set per rank by its node
script) is separate: every rank writes its own values at most once a second, with no
collective, over the window of the progress lines (its last record covers the last
line's steps), and splits step time into its own work and its wait for the others (keys
step, loss, samples_per_s, step_s, data_wait_s, work_s, sync_s, steps, time); see
channel.py.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TextIO


def emit(line: str, stream: TextIO | None = None) -> None:
    """Write ``line`` and its newline in one write() call, then flush.

    print() hands the text and the newline over separately; with PYTHONUNBUFFERED set
    (launchers often set it) they become two writes, and ranks sharing one stdout can
    splice their lines together.
    """
    out = stream if stream is not None else sys.stdout
    out.write(line + "\n")
    out.flush()


def reported_at(step: int, log_every: int, total_steps: int, stopped: bool = False) -> bool:
    """Whether a progress line follows ``step``: every ``log_every`` steps, after the last
    step, and after the step a stop ended at."""
    return stopped or step >= total_steps or step % log_every == 0


@dataclass(frozen=True)
class WindowStats:
    """Training progress over the steps since the previous report."""

    step: int
    total_steps: int
    epoch: int  # 1-based, for people
    epochs: int
    loss: float
    rank_loss: float
    samples_per_s: float
    step_time_s: float
    data_wait_s: float

    @property
    def data_wait_share(self) -> float:
        return self.data_wait_s / self.step_time_s if self.step_time_s > 0 else 0.0


def progress_line(stats: WindowStats) -> str:
    return (
        f"step {stats.step}/{stats.total_steps} epoch {stats.epoch}/{stats.epochs} "
        f"loss {stats.loss:.4f} samples/s {stats.samples_per_s:.0f} "
        f"step_ms {stats.step_time_s * 1000:.2f} data_wait {stats.data_wait_share:.1%}"
    )


def summary_line(
    *,
    steps: int,
    final_loss: float,
    test_accuracy: float | None,
    samples_per_s: float,
    data_wait_share: float,
    train_s: float,
    total_s: float,
) -> str:
    accuracy = f", test acc {test_accuracy:.1%}" if test_accuracy is not None else ""
    return (
        f"done: {steps} steps, final loss {final_loss:.4f}{accuracy}, "
        f"{samples_per_s:.0f} samples/s, data wait {data_wait_share:.1%}, "
        f"train {train_s:.1f} s, total {total_s:.1f} s"
    )


class MetricsWriter:
    """Appends one JSON line per report to this rank's metrics file (if it has one)."""

    def __init__(self, template: str | None, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self._file: IO[str] | None = None
        if template is None or ("{rank}" not in template and rank != 0):
            return
        path = Path(template.format(rank=rank))
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", buffering=1, encoding="utf-8")

    def write(self, stats: WindowStats, lr: float) -> None:
        if self._file is None:
            return
        record = {
            "step": stats.step,
            "epoch": stats.epoch,
            "rank": self.rank,
            "world_size": self.world_size,
            "loss": stats.loss,
            "rank_loss": stats.rank_loss,
            "samples_per_s": stats.samples_per_s,
            "step_time_s": stats.step_time_s,
            "data_wait_s": stats.data_wait_s,
            "data_wait_share": stats.data_wait_share,
            "lr": lr,
            "time": time.time(),
        }
        self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
