"""What the command line shows of runs, as it takes it from the stages below: the per-rank
table of `top` (console/rank_table), the plot (console/plot), the sizes and durations it
writes, a run's goodput (record/goodput/words.py), and a run's state as a reader of its
record sees it (record/states.py). Named here so that `cli/` reaches the rest of the
package through the API alone (tests/unit/test_layout.py)."""

from __future__ import annotations

from orchestrator.console.plot import draw, load
from orchestrator.console.rank_table import RunView, duration
from orchestrator.record.goodput.words import goodput_table
from orchestrator.record.recoveries import describe_recovery
from orchestrator.record.runs import run_status
from orchestrator.record.world import describe_world
from orchestrator.sizes import human_bytes, parse_size
from orchestrator.slurm.recovery.segments import describe_segment

__all__ = [
    "RunView",
    "describe_recovery",
    "describe_segment",
    "describe_world",
    "draw",
    "duration",
    "goodput_table",
    "human_bytes",
    "load",
    "parse_size",
    "run_status",
]
