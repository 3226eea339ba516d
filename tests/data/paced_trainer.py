"""The bundled trainer with its optimizer steps paced: one every PACED_STEP_S seconds at
most (a sleep before a step that would come sooner).

For the tests whose point is how long a run lasts on the clock (a run carried across time
limits): N paced steps last N x PACED_STEP_S seconds whatever the machine's speed and load
(as long as a step computes in less), while the same trainer unpaced reaches the same
weights in seconds (a sleep changes no number), so the uninterrupted run it is compared with
stays cheap.
"""

from __future__ import annotations

import os
import runpy
import time

import torch

PACE_S = float(os.environ["PACED_STEP_S"])
_step = torch.optim.SGD.step
_last = [-float("inf")]  # when the previous step began (monotonic)


def paced_step(self, *args, **kwargs):
    wait = _last[0] + PACE_S - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    _last[0] = time.monotonic()
    return _step(self, *args, **kwargs)


# Before the trainer builds its optimizer, so that torch's step hooks wrap this one.
torch.optim.SGD.step = paced_step
runpy.run_module("orchestrator.trainer", run_name="__main__", alter_sys=True)
