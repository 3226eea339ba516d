"""Entry point for ``python -m orchestrator.trainer``."""

from __future__ import annotations

import gc
import os
import sys

from orchestrator.trainer.entry import main
from orchestrator.trainer.exits import EXIT_FAILURE

exit_code = main()
if exit_code == EXIT_FAILURE:
    # A peer rank was lost or the process group failed, and the one-line error is out.
    # torch's communication threads may still be blocked on that peer: tearing them down
    # at interpreter exit can wait on it again, or abort the process ("terminate called
    # without an active exception", exit -6 instead of 1). Leave at once instead.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
# Everything is flushed and closed by now. Freezing the heap spares the interpreter a
# last garbage collection over torch's large object graph, a few tenths of a second
# (seconds on a busy machine) between the summary line and the process exit.
gc.freeze()
sys.exit(exit_code)
