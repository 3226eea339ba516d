"""A job that computes silently is not a hang: two local ranks crunch numbers for 20 s
without printing, under --hang-timeout 4 (a check every 9 s: two rounds of stacks 5 s
apart), so at least two checks fall in the crunch; they see the main threads move, say once
that the job works, and the run succeeds."""

from __future__ import annotations

import json
import re
import shutil
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
crunch(20)
tensor = torch.ones(1)
dist.all_reduce(tensor)
print("reduced", tensor.item(), flush=True)
# torch 2.13's gloo may abort at exit (SIGABRT, "terminate called without an active
# exception") in a program that leaves its process group up, under plain torchrun too.
dist.destroy_process_group()
"""


def launch_local(tmp_path: Path, run_id: str, *args: str):
    """`launch` on this machine's two local ranks, its record in tmp_path/runs."""
    argv = ["launch", str(REPO / "hostfiles" / "local.txt"), "--run-dir", str(tmp_path / "runs")]
    done = run_cli([*argv, "--run-id", run_id, *args], cwd=tmp_path, timeout=300)
    print(done.stdout)
    return done


def test_silent_work_is_not_stopped(tmp_path: Path) -> None:
    (tmp_path / "crunch.py").write_text(JOB)
    runs = tmp_path / "runs"
    done = launch_local(tmp_path, "silent", "--hang-timeout", "4", "--", "crunch.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" s apart: working") == 1, done.stdout
    assert "hung" not in done.stdout
    assert status_of(runs, "silent")["state"] == "succeeded"
    rounds = list((runs / "silent" / "stacks").iterdir())
    assert len(rounds) >= 4, "two checks of two samples or more, their stacks kept"


def test_a_local_hang_is_named_by_stacks_and_the_flight_recorder(tmp_path: Path) -> None:
    """Two local ranks, rank 1 stuck before the all_reduce rank 0 waits in: the run ends
    hung, and torch's flight recorder, dumped by the ranks' hook thread on the agent's
    word and read by torch's analyser, names the collective rank 1 never joined."""
    runs = tmp_path / "runs"
    job = str(REPO / "tests" / "data" / "hang_job.py")
    done = launch_local(
        tmp_path, "stuck", "--hang-timeout", "5", "--env", "STUCK_RANK=1", "--", job
    )
    assert done.returncode == 1, done.stdout + done.stderr
    finding = (
        "flight recorder: rank 1 (localhost) never joined collective #1 "
        "(gloo:all_reduce, group 0:default_pg) that the other ranks entered ("
    )
    assert done.stdout.count(finding) == 2, "on the console when found, and in the summary"
    assert "deprecated" not in done.stdout  # torch warns of no variable we set
    status = status_of(runs, "stuck")
    assert status["state"] == "hung"
    assert status["hang"]["stuck_ranks"] == [1]
    assert status["hang"]["flight"]["missing"][0]["ranks"] == [1]
    flight = runs / "stuck" / "flight"
    assert sorted(p.name for p in flight.iterdir()) == ["analysis.txt", "rank_0", "rank_1"]
    (second,) = [p for p in (runs / "stuck" / "stacks").iterdir() if p.name.endswith("-2")]
    for record in json.loads((second / "stacks.json").read_text())["ranks"]:
        files = {f["file"] for t in record["threads"] for f in t["frames"]}
        assert not any(f.endswith("sitecustomize.py") for f in files), (
            "the hook's thread is left out"
        )


TIMES_OUT = """\
import datetime, os, sys, time
import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d


def dump_as_torch_does_on_a_timeout():
    # NCCL's watchdog writes this file itself when a collective times out; gloo (CPU) never
    # does, so the job writes it the same way, to the same place, from the same recorder.
    with open(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + os.environ["RANK"], "wb") as f:
        f.write(c10d._dump_fr_trace())


dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
dist.all_reduce(torch.ones(1))
if dist.get_rank() == 1:
    dump_as_torch_does_on_a_timeout()
    time.sleep(60)
try:
    dist.all_reduce(torch.ones(1))
except RuntimeError:
    dump_as_torch_does_on_a_timeout()
    os._exit(1)  # at once, as NCCL's watchdog ends a rank: gloo may abort in a normal exit
"""


def test_a_failed_runs_summary_reads_the_dumps_torch_left(tmp_path: Path) -> None:
    """After a failure, the dumps torch wrote into the node's flight folder (on NCCL, at a
    collective's timeout) come back to the record, and torch's analyser names the rank that
    never joined the collective that timed out."""
    (tmp_path / "times_out.py").write_text(TIMES_OUT)
    runs = tmp_path / "runs"
    done = launch_local(tmp_path, "late", "--", "times_out.py")
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "flight recorder: rank 1 (localhost) never joined collective #2 "
        "(gloo:all_reduce, group 0:default_pg) that the other ranks entered, called at "
        "times_out.py:20"
    ) in done.stdout
    assert sorted(p.name for p in (runs / "late" / "flight").iterdir()) == [
        "analysis.txt", "rank_0", "rank_1",
    ]  # fmt: skip


HANGS_ONCE = Path(__file__).resolve().parents[1] / "data" / "hangs_once.py"


def test_a_hang_under_max_restarts_restarts_the_workers(tmp_path: Path) -> None:
    """--max-restarts 1: the hang is named, the stuck rank ended, torchrun starts the
    workers again, and the second attempt (which does not hang) succeeds."""
    shutil.copy(HANGS_ONCE, tmp_path)
    runs = tmp_path / "runs"
    done = launch_local(
        tmp_path, "again", "--hang-timeout", "5", "--max-restarts", "1", "--", "hangs_once.py"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "ending rank 1 so that torchrun restarts the workers (restart 1 of --max-restarts 1)"
        in done.stdout
    )
    assert "[localhost r[0-1]] reduced 2.0" in done.stdout  # both ranks, the second attempt
    status = status_of(runs, "again")
    assert status["state"] == "succeeded" and status["restarts"] == 1
    assert "hang" not in status  # restarted, not ended hung


def test_a_jobs_own_pythonpath_keeps_the_stack_hook(tmp_path: Path) -> None:
    """--env PYTHONPATH=...: the ranks still load the stack hook (first on their path), so
    stacks by signal and the flight recorder's dumps still reach them; the job's entries
    follow it."""
    (tmp_path / "where.py").write_text(
        "import os, sys\n"
        "print('hook', sys.modules['sitecustomize'].__file__, flush=True)\n"
        "print('path', os.environ['PYTHONPATH'], flush=True)\n"
    )
    done = launch_local(tmp_path, "path", "--env", "PYTHONPATH=/opt/mine", "--", "where.py")
    assert done.returncode == 0, done.stdout + done.stderr
    hook = re.search(r"\] hook (\S+)", done.stdout)
    assert hook and hook.group(1).endswith("/stack_hook/sitecustomize.py"), done.stdout
    assert re.search(r"\] path \S+/stack_hook:/opt/mine$", done.stdout, re.M), done.stdout
