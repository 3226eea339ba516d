"""The bundled trainer with one rank that crashes once, for the --max-restarts tests.

In torchrun's first attempt (TORCHELASTIC_RESTART_COUNT=0), rank CRASH_ONCE_RANK exits
with code 3 as soon as a checkpoint is in --checkpoint-dir; after torchrun restarts the
workers, the trainer (run with --resume) continues from that checkpoint.
"""

from __future__ import annotations

import os
import runpy
import sys
import threading
import time
from pathlib import Path


def crash_after_a_checkpoint(directory: Path) -> None:
    while not any(directory.glob("ckpt-*.pt")):
        time.sleep(0.005)
    print(f"rank {os.environ['RANK']} crashing once (attempt 0)", flush=True)
    os._exit(3)


if os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0" and os.environ.get("RANK") == os.environ.get(
    "CRASH_ONCE_RANK"
):
    checkpoints = Path(sys.argv[sys.argv.index("--checkpoint-dir") + 1])
    threading.Thread(target=crash_after_a_checkpoint, args=(checkpoints,), daemon=True).start()
runpy.run_module("orchestrator.trainer", run_name="__main__", alter_sys=True)
