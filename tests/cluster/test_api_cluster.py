"""The Python API over SSH, on the namespace cluster's nodes: a failing job launched from
Python names its failing rank and host; logs(follow=True) yields every line of every rank;
a run attached to by id is seen to end; stop() leaves nothing running on any node."""

from __future__ import annotations

from pathlib import Path

import pytest

import orchestrator
from tests.cli_helpers import assert_nothing_left

pytestmark = pytest.mark.cluster

JOB = """\
import os, sys, time
import torch.distributed as dist
rank = int(os.environ["RANK"])
for i in range(30):
    print(f"line {i} of rank {rank}", flush=True)
dist.init_process_group("gloo")
dist.barrier()  # every rank has printed all its lines before one fails
if os.environ.get("JOB") == "fail" and rank == 1:
    sys.exit(3)
if os.environ.get("JOB") == "sleep":
    print("sleeping", flush=True)
    time.sleep(300)
dist.destroy_process_group()  # gloo may abort at exit without it (torch 2.13)
"""


@pytest.fixture
def on_the_cluster(cluster, tmp_path: Path, monkeypatch) -> str:
    """This process set up as the lab's controller (its ssh config and keys), in tmp_path;
    the hostfile of two of its nodes."""
    for name, value in cluster.environ().items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text(JOB)
    return str(cluster.write_hostfile(tmp_path / "hosts.txt", cluster.nodes[:2]))


def test_a_failing_job_from_python_names_its_rank_and_host(cluster, on_the_cluster) -> None:
    run = orchestrator.launch(on_the_cluster, ["job.py"], env=["JOB=fail"], run_id="api-fails")
    lines = list(run.logs(follow=True))
    for rank in (0, 1):
        host = cluster.nodes[rank].name
        mine = [line for line in lines if line.startswith(f"[{host} r{rank}] line ")]
        assert [line.split()[3] for line in mine] == [str(i) for i in range(30)], lines
    outcome = run.wait(timeout=120)
    assert (outcome.state, outcome.exit_code) == ("failed", 3), outcome
    assert outcome.failure is not None
    assert (outcome.failure.rank, outcome.failure.host) == (1, cluster.nodes[1].name)
    assert "line 29 of rank 1" in outcome.failure.last_lines
    assert_nothing_left("api-fails")


def test_attach_sees_a_run_end_and_stop_leaves_nothing(cluster, on_the_cluster) -> None:
    orchestrator.launch(on_the_cluster, ["job.py"], env=["JOB=sleep"], run_id="api-sleeps")
    run = orchestrator.attach("api-sleeps")  # by id, as another program would
    assert run.state == "running"
    outcome = run.stop(wait=120)
    assert outcome.state == "stopped", outcome
    assert orchestrator.attach("api-sleeps").wait(timeout=10).state == "stopped"
    assert_nothing_left("api-sleeps")
