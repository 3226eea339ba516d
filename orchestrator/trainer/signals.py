"""Catching stop signals during training, and ending at a step all ranks agree on."""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from orchestrator.trainer.distributed import Runtime

# SIGTERM: the orchestrator (or torchrun, or scancel) stopping the job.
# SIGUSR1: SLURM's warning before a time limit (sbatch --signal=USR1@SECONDS).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequest:
    """Records SIGTERM/SIGUSR1 instead of dying, so training can stop at a safe point.

    The handler only stores the first signal number; the training loop turns it into an
    agreed stop (see ``StopAgreement``).
    """

    def __init__(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
        self.signum = 0
        self.at = 0.0  # time.monotonic() when the first signal came
        self._previous = {sig: signal.signal(sig, self._handle) for sig in signals}

    def _handle(self, signum: int, frame: object) -> None:
        if not self.signum:
            self.signum, self.at = signum, time.monotonic()

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class StopAgreement:
    """Lets all ranks stop after the same optimizer step, whoever got the signal.

    Ranks see a signal at slightly different times, and a rank that left the loop alone
    would leave the others blocked in the next gradient all-reduce. So at agreed steps
    every rank starts a tiny MAX all-reduce of [its signal number, -its proposed
    interval] and all act on the same result.

    The all-reduce never holds up training: it runs on the gloo control group (CPU
    tensors, so no GPU stream and no host-device sync), is started without waiting
    (``async_op``) after step n, and is read after step n+1, by which time it has long
    finished on every rank that kept up. Each rank reads it at the same step, so all
    ranks still stop after the same step, one step later than a blocking check would.

    A check still costs CPU time (gloo's thread, the tensor) and lines the ranks' hosts
    up; on CPU ranks that already use every core, a check at every step costs about a
    quarter of a small model's throughput (benchmarks/bench_trainer.py). So the interval
    adapts: each check proposes the number of steps that takes about ``target_s`` of
    training (at least 1), and the smallest proposal wins, so a stop lands within about
    ``target_s`` or two steps of the signal, whichever is longer. ``every`` fixes the
    interval instead.
    """

    def __init__(
        self,
        runtime: Runtime,
        request: StopRequest,
        every: int | None = None,
        target_s: float = 0.25,
        max_interval: int = 1000,
    ) -> None:
        self.runtime = runtime
        self.request = request
        self.every = every
        self.target_s = target_s
        self.max_interval = max_interval
        self.interval = every or 1
        self.checks = 0
        self._next: int | None = None  # the step after which the next check starts
        self._pending: tuple[Any, torch.Tensor] | None = None  # (work, its tensor)
        self._last: tuple[int, float] | None = None  # (step, time) of the previous check

    def poll(self, completed_steps: int) -> int:
        """Call after every optimizer step on every rank; returns the agreed signal or 0."""
        if not self.runtime.distributed:
            return self.request.signum
        signum = self._finish_pending() if self._pending is not None else 0
        if signum:
            return signum
        if self._next is None:
            self._next = completed_steps
        if completed_steps >= self._next:
            self._start(completed_steps)
        return 0

    def close(self) -> None:
        """Wait for a check still in flight (every rank started it, so it completes)."""
        if self._pending is not None:
            self._finish_pending()

    def _start(self, step: int) -> None:
        now = time.perf_counter()
        message = torch.tensor([self.request.signum, -self._propose(step, now)], dtype=torch.int64)
        work = dist.all_reduce(
            message, op=dist.ReduceOp.MAX, group=self.runtime.control_group, async_op=True
        )
        self._pending = (work, message)
        self._last = (step, now)
        # Until its result is read nobody knows the next interval; assume the longest,
        # the read below sets the real one.
        self._next = step + self.max_interval

    def _finish_pending(self) -> int:
        assert self._pending is not None and self._last is not None
        work, message = self._pending
        self._pending = None
        work.wait()
        self.checks += 1
        signum, interval = int(message[0]), -int(message[1])
        self.interval = interval
        self._next = self._last[0] + interval
        return signum

    def _propose(self, step: int, now: float) -> int:
        if self.every is not None:
            return self.every
        if self._last is None or step == self._last[0]:
            return 1
        step_s = (now - self._last[1]) / (step - self._last[0])
        return max(1, min(self.max_interval, int(self.target_s / max(step_s, 1e-9))))
