"""Entry point for ``python -m orchestrator.trainer``."""

from __future__ import annotations

import gc
import sys

from orchestrator.trainer.cli import main

exit_code = main()
# Everything is flushed and closed by now. Freezing the heap spares the interpreter a
# last garbage collection over torch's large object graph, a few tenths of a second
# (seconds on a busy machine) between the summary line and the process exit.
gc.freeze()
sys.exit(exit_code)
