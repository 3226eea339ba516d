"""The Python API on this machine (two local ranks): a run launched, followed, waited for,
stopped and attached to from Python; from a thread other than the main one and from inside
a running asyncio loop; bad input refused before anything starts. (The same over SSH on
the namespace cluster: tests/cluster/test_api_cluster.py.)"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

import orchestrator
from tests.cli_helpers import REPO, assert_nothing_left

HOSTS = str(REPO / "hostfiles" / "local.txt")

FAILS = """\
import os, sys
import torch.distributed as dist
rank = int(os.environ["RANK"])
for i in range(50):
    print(f"line {i} of rank {rank}", flush=True)
dist.init_process_group("gloo")
dist.barrier()  # every rank has printed all its lines before one fails
if rank == 1:
    print("rank 1 gives up", flush=True)
    sys.exit(3)
dist.destroy_process_group()  # gloo may abort at exit without it (torch 2.13)
"""

SLEEPS = """\
import time
print("sleeping", flush=True)
time.sleep(300)
"""


def write(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return name


def test_a_failing_run_driven_from_python(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    notes: list[str] = []
    run = orchestrator.launch(
        HOSTS, [write(tmp_path, "fails.py", FAILS)], run_dir="runs", run_id="fails",
        say=notes.append,
    )  # fmt: skip
    assert isinstance(run, orchestrator.Run) and run.run_id == "fails"
    lines = list(run.logs(follow=True))  # every line, until the run ends
    for rank in (0, 1):
        mine = [line for line in lines if line.startswith(f"[localhost r{rank}] line ")]
        assert len(mine) == 50, lines
    outcome = run.wait(timeout=60)
    assert (outcome.state, outcome.exit_code) == ("failed", 3)
    assert outcome.failure is not None
    assert (outcome.failure.rank, outcome.failure.host, outcome.failure.exit_code) == (
        1, "localhost", 3,
    )  # fmt: skip
    assert "rank 1 gives up" in outcome.failure.last_lines
    with pytest.raises(orchestrator.RunFailed, match="rank 1 on localhost"):
        outcome.check()
    assert "rank 1 gives up" in list(run.logs(rank=1))
    assert run.status().state == "failed"
    assert_nothing_left("fails")


def test_stop_and_attach(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    run = orchestrator.launch(HOSTS, [write(tmp_path, "sleeps.py", SLEEPS)], run_id="sleeps")
    seen = orchestrator.attach("sleeps", run_dir="runs")  # as another program would
    assert seen.state == "running" and not seen.done()
    outcome = run.stop(wait=60)
    assert outcome.state == "stopped", outcome
    assert seen.wait(timeout=10).state == "stopped"
    assert_nothing_left("sleeps")


def test_launch_from_a_thread_and_from_an_asyncio_loop(tmp_path: Path, monkeypatch) -> None:
    """No signal handler, no fork of the caller: both start and end like any launch."""
    monkeypatch.chdir(tmp_path)
    script = write(tmp_path, "hello.py", "print('hello', flush=True)\n")
    found: dict[str, object] = {}

    def in_thread() -> None:
        try:
            found["thread"] = orchestrator.launch(HOSTS, [script], run_id="thread").wait(60)
        except BaseException as error:  # noqa: BLE001 - the test reads it below
            found["thread"] = error

    worker = threading.Thread(target=in_thread)
    worker.start()
    worker.join(120)

    async def in_loop():
        run = orchestrator.launch(HOSTS, [script], run_id="loop")
        return await asyncio.to_thread(run.wait, 60)

    found["loop"] = asyncio.run(in_loop())
    for key in ("thread", "loop"):
        outcome = found[key]
        assert isinstance(outcome, orchestrator.RunOutcome), outcome
        assert outcome.state == "succeeded", outcome
    lines = list(orchestrator.attach("loop").logs())
    assert "[localhost r0] hello" in lines and "[localhost r1] hello" in lines


def test_bad_input_is_refused_before_anything_starts(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(orchestrator.ConfigError, match="missing.py"):
        orchestrator.launch(HOSTS, ["missing.py"], run_id="nothing")
    with pytest.raises(orchestrator.ConfigError, match="no keyword 'gpus'"):
        orchestrator.launch(HOSTS, [], gpus=4)
    bad = tmp_path / "hosts.txt"
    bad.write_text("localhost slots=2\nlocalhost slots=x\n")
    with pytest.raises(orchestrator.ConfigError, match=r"hosts.txt:2"):
        orchestrator.launch(str(bad), [])
    assert not (tmp_path / "runs").exists()  # nothing started, no record
