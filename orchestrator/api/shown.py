"""What the command line shows of runs, as it takes it from the stages below: the per-rank
table of `top` (console/rank_table), the plot (console/plot), the sizes and durations it
writes, a run's goodput (record/goodput/words.py), a run's state as a reader of its
record sees it (record/states.py) and a SLURM run's attempts (record/older_names.py reads
them, from older records too). Named here so that `cli/` reaches the rest of the package
through the API alone (tests/unit/test_layout.py)."""

from __future__ import annotations

from orchestrator.console.plot import draw, load
from orchestrator.console.rank_table import RunView, duration
from orchestrator.record.goodput.words import goodput_table
from orchestrator.record.older_names import job_attempts
from orchestrator.record.recoveries import describe_recovery
from orchestrator.record.runs import run_status
from orchestrator.record.world import describe_world
from orchestrator.sizes import human_bytes, parse_size
from orchestrator.slurm.recovery.job_attempts import describe_job_attempt

__all__ = [
    "RunView",
    "describe_recovery",
    "describe_job_attempt",
    "describe_world",
    "draw",
    "duration",
    "goodput_table",
    "human_bytes",
    "job_attempts",
    "load",
    "parse_size",
    "run_status",
]
