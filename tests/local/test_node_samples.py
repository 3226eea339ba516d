"""A node sample of real processes (orchestrator.agent.sampling): a busy rank, counted by
the RANK in its environment, and a process that is no rank's. Seconds of real CPU time,
so it is not among the unit tests (the metrics' pure parts are
tests/unit/supervise/test_metrics.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from orchestrator.agent.processes import tree_of
from orchestrator.agent.sampling import Sampler

BUSY = "import time\nend = time.time() + 4\nwhile time.time() < end: pass\n"


def test_a_sample_counts_each_ranks_processes_by_the_rank_in_their_environment() -> None:
    env = dict(os.environ, RANK="7")
    # A rank's shell, and the busy process under it, as run_rank starts them.
    rank = subprocess.Popen(["bash", "-c", f'{sys.executable} -c "$0"; true', BUSY], env=env)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(4)"])
    try:
        sampler = Sampler(os.getpid())
        time.sleep(0.5)
        assert {rank.pid, other.pid} <= set(tree_of(os.getpid()))
        sampler.sample()
        time.sleep(2.0)
        sample = sampler.sample()
    finally:
        rank.wait()
        other.wait()
    assert set(sample["ranks"]) == {"7"}
    mine = sample["ranks"]["7"]
    assert mine["rss_bytes"] > 1 << 20
    assert mine["cpu_percent"] > 20  # busy the whole time, on a machine that may be shared
    assert sample["cpu_percent"] >= mine["cpu_percent"]
    assert sample["mem_total_bytes"] >= sample["mem_available_bytes"] > 0
    assert sample["gpus"] == [] or all("index" in gpu for gpu in sample["gpus"])
