"""Catching stop signals during training, so the loop can end at a step all ranks agree on."""

from __future__ import annotations

import signal

# SIGTERM: the orchestrator (or torchrun, or scancel) stopping the job.
# SIGUSR1: SLURM's warning before a time limit (sbatch --signal=USR1@SECONDS).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequest:
    """Records SIGTERM/SIGUSR1 instead of dying, so training can stop at a safe point.

    The handler only stores the first signal number; the training loop turns it into an
    agreed stop (see ``distributed.StopAgreement``).
    """

    def __init__(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
        self.signum = 0
        self._previous = {sig: signal.signal(sig, self._handle) for sig in signals}

    def _handle(self, signum: int, frame: object) -> None:
        if not self.signum:
            self.signum = signum

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
