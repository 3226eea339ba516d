"""A job that computes silently is not a hang: two local ranks crunch numbers for 40 s
without printing, under --hang-timeout 10; the checks see their stacks move, say once that
the job works silently, and the run succeeds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_helpers import REPO, run_cli, status_of

pytestmark = pytest.mark.slow

JOB = """\
import time
import torch
import torch.distributed as dist


def crunch(seconds):
    end, total = time.time() + seconds, 0
    while time.time() < end:
        total += sum(i * i for i in range(2000))
    return total


dist.init_process_group("gloo")
crunch(40)
tensor = torch.ones(1)
dist.all_reduce(tensor)
print("reduced", tensor.item(), flush=True)
"""


def test_silent_work_is_not_stopped(tmp_path: Path) -> None:
    (tmp_path / "crunch.py").write_text(JOB)
    runs = tmp_path / "runs"
    done = run_cli(
        ["launch", str(REPO / "hostfiles" / "local.txt"), "--run-dir", str(runs),
         "--run-id", "silent", "--hang-timeout", "10", "--", "crunch.py"],
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("working silently") == 1, done.stdout
    assert "hung" not in done.stdout
    assert status_of(runs, "silent")["state"] == "succeeded"
    assert list((runs / "silent" / "stacks").iterdir()), "the checks' stacks are kept"
