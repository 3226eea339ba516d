"""The bundled trainer with every optimizer step made PACED_STEP_S seconds longer by a sleep.

For the tests whose point is how long a run lasts on the clock (a run carried across time
limits): a few thousand paced steps outlast a job's warning whatever the machine's speed,
while the same trainer unpaced reaches the same weights in seconds (a sleep changes no
number), so the uninterrupted run it is compared with stays cheap.
"""

from __future__ import annotations

import os
import runpy
import time

import torch

PACE_S = float(os.environ["PACED_STEP_S"])
_step = torch.optim.SGD.step


def paced_step(self, *args, **kwargs):
    time.sleep(PACE_S)
    return _step(self, *args, **kwargs)


# Before the trainer builds its optimizer, so that torch's step hooks wrap this one.
torch.optim.SGD.step = paced_step
runpy.run_module("orchestrator.trainer", run_name="__main__", alter_sys=True)
