"""Per-rank timing records for the orchestrator's metrics channel.

The orchestrator's node script gives every rank its own file in
``ORCHESTRATOR_METRICS_FILE`` and ships each JSON line appended to it to the controller.
When the variable is set, each rank appends one record at most once a second of its own
wall time, decided by that rank alone (no collective, so records never line the ranks
up), and one after the last step, whether the run finishes or a stop signal ends it::

    {"step": 120, "loss": 0.41, "samples_per_s": 5120.0, "step_s": 0.0125,
     "data_wait_s": 0.0002, "work_s": 0.0091, "sync_s": 0.0034, "steps": 80,
     "time": 1717171717.5}

Everything but ``step`` (optimizer steps completed) and ``time`` (Unix seconds) covers
the ``steps`` steps of the record's window, and only this rank's share: loss is the mean
over its own micro-batches, samples_per_s counts its own samples, and the ``_s`` keys
are wall seconds per step.

The window is the one the trainer's progress lines average over, so a record means what
the console's last line means (and `orchestrator top` shows it): it begins at the later
of the rank's previous record and the previous progress line. Where the lines come at
least once every INTERVAL_S (at the window's pace), a record that falls due waits for the
next line, so each record covers one line's steps exactly; where they come less often, a
record covers the second since the previous one (or less, after a line). The last record
of a run covers the last line's steps (or the part after a record). The steps of a window
that ends in a progress line without a record are in no record.

``step_s`` = ``work_s`` + ``sync_s``, where ``sync_s`` is the time spent waiting in
collectives (DDP's gradient all-reduce, the stop check, the progress line's loss sum, a
checkpoint's RNG gather; 0 without other ranks) and ``work_s`` everything else (batches,
forward, backward, optimizer, saving). In synchronous data parallelism every rank's
step_s is the same; the slow rank is the one with the largest work_s, and the others
show it as sync_s.

Rank 0 also writes two marks, records without ``step`` that say where the run's time went
(the orchestrator's goodput): ``{"from_step": 40, "time": ...}`` as its first step begins
(after 40 steps done: 0, or the checkpoint it resumed from), and ``{"checkpoint": 40,
"save_s": 0.21, "time": ...}`` once a checkpoint is saved (save_s: from the RNG gather to
the file in place).

Times are host times: on CUDA the host runs ahead of the GPU, so waits show up wherever
the host next waits for the device. Without the variable nothing is opened or measured.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import IO

import torch
from torch import nn
from torch.autograd import Variable

from orchestrator.trainer.reporting import emit, reported_at

ENV = "ORCHESTRATOR_METRICS_FILE"
INTERVAL_S = 1.0


class MetricsChannel:
    """This rank's record writer and the accumulators between two records.

    The loop adds to ``losses`` and ``sync_s`` as it goes; step and data-wait counts are
    running totals the loop keeps anyway, so records take differences of them instead of
    costing the hot loop anything.
    """

    def __init__(self, file: IO[str], path: str, samples_per_step: int) -> None:
        self._file: IO[str] | None = file
        self.path = path
        self.samples_per_step = samples_per_step
        self.losses: list[torch.Tensor] = []  # micro-batch losses, left on the device
        self.sync_s = 0.0  # waiting in collectives since the previous record
        self.grad_ready = 0.0  # perf_counter when backward's last computation ended
        self._queued = False
        self.due = math.inf
        self._since = 0.0
        self._step = 0
        self._data_s = 0.0

    def start(self, now: float, step: int, data_s: float = 0.0) -> None:
        """Begin the first interval at ``now``, after ``step`` completed steps."""
        self._since, self._step, self._data_s = now, step, data_s
        self.due = now + INTERVAL_S

    def after_step(
        self,
        step: int,
        data_s: float,
        *,
        log_every: int,
        total_steps: int,
        stopped: bool = False,
        now: float | None = None,
    ) -> None:
        """After each optimizer step (``step`` completed, ``data_s`` the running total of
        data waits): write a record when one is due, else begin a new window if a
        progress line was printed after this step (see the module's docstring). The last
        step of a run, finished or ``stopped``, is recorded whatever is due.
        """
        now = time.perf_counter() if now is None else now
        reported = reported_at(step, log_every, total_steps, stopped)
        last = stopped or step >= total_steps
        if last or (now >= self.due and (reported or self._lines_far_apart(step, log_every, now))):
            self.record(step, data_s, now)
        elif reported:
            self.losses.clear()
            self.sync_s = 0.0
            self._since, self._step, self._data_s = now, step, data_s

    def _lines_far_apart(self, step: int, log_every: int, now: float) -> bool:
        """Whether progress lines come less often than every INTERVAL_S, at the pace of
        the steps since the window began."""
        steps = step - self._step
        return steps <= 0 or log_every * (now - self._since) / steps > INTERVAL_S

    def watch_gradients(self, model: nn.Module) -> None:
        """Note when backward's computation ends, so a step can tell it from the all-reduce.

        DDP starts each bucket's all-reduce as its gradients are accumulated and, once the
        last one is, queues a callback that waits for them all before backward() returns.
        A callback queued earlier runs first, at the moment the computation ends: from then
        to backward's return, the rank waits for the all-reduce, slower ranks included.
        One hook on one parameter queues it, so the cost does not grow with the model; it
        only reads the clock (a DDP comm hook would touch the gradients). The parameter
        registered last usually belongs to the output layer, whose gradient comes first.
        """
        trained = [p for p in model.parameters() if p.requires_grad]
        if trained:
            trained[-1].register_post_accumulate_grad_hook(self._in_backward)

    def _in_backward(self, param: torch.Tensor) -> None:
        if not self._queued:  # a parameter used twice has its hook called twice
            self._queued = True
            Variable._execution_engine.queue_callback(self._computed)

    def _computed(self) -> None:
        self._queued = False
        self.grad_ready = time.perf_counter()

    def waited(self, since: float) -> float:
        """Count the time from ``since`` to now as waiting in a collective; returns now."""
        now = time.perf_counter()
        self.sync_s += now - since
        return now

    def record(self, step: int, data_s: float, now: float | None = None) -> None:
        """Append the record for the steps up to ``step``; ``data_s`` is a running total."""
        now = time.perf_counter() if now is None else now
        steps = step - self._step
        if steps <= 0:
            return
        wall = now - self._since
        # Reading the losses syncs the device once per record, not once per step.
        loss = torch.stack(self.losses).mean().item() if self.losses else math.nan
        step_s, sync_s = wall / steps, self.sync_s / steps
        record = {
            "step": step,
            "loss": loss,
            "samples_per_s": steps * self.samples_per_step / wall if wall > 0 else 0.0,
            "step_s": step_s,
            "data_wait_s": (data_s - self._data_s) / steps,
            "work_s": step_s - sync_s,
            "sync_s": sync_s,
            "steps": steps,
            "time": time.time(),
        }
        self._write(json.dumps(record) + "\n")
        self.losses.clear()
        self.sync_s = 0.0
        self._since, self._step, self._data_s = now, step, data_s
        self.due = now + INTERVAL_S

    def checkpointed(self, step: int, save_s: float) -> None:
        """The checkpoint of ``step`` was saved, in ``save_s`` seconds: a mark at once."""
        self._write(json.dumps({"checkpoint": step, "save_s": save_s, "time": time.time()}) + "\n")

    def began(self, step: int) -> None:
        """Training begins now after ``step`` steps (0, or the checkpoint resumed): a mark."""
        self._write(json.dumps({"from_step": step, "time": time.time()}) + "\n")

    def _write(self, line: str) -> None:
        if self._file is None:
            return
        try:
            self._file.write(line)
        except OSError as exc:  # a full disk must not end the training
            _warn(self.path, exc)
            self.close()

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None


def open_channel(samples_per_step: int) -> MetricsChannel | None:
    """This rank's channel if ``ORCHESTRATOR_METRICS_FILE`` is set and can be opened.

    The orchestrator creates the directory; a path that cannot be opened costs a warning,
    never the run.
    """
    path = os.environ.get(ENV)
    if not path:
        return None
    try:
        file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (closed by close())
    except OSError as exc:
        _warn(path, exc)
        return None
    return MetricsChannel(file, path, samples_per_step)


def _warn(path: str, exc: OSError) -> None:
    reason = exc.strerror or str(exc)
    emit(
        f"warning: cannot write {ENV} {path}: {reason}; training goes on without metrics",
        sys.stderr,
    )
