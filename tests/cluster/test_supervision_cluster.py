"""Supervision on the namespace cluster: whatever happens, the run stops on every node and
nothing of it is left running. Each test ends by looking at the process table."""

from __future__ import annotations

import re
import signal
import textwrap
import time
from pathlib import Path

import pytest

from tests.cli_helpers import (
    SPLICE,
    assert_nothing_left,
    check_lines,
    run_cli,
    run_pids,
    start_cli,
    status_of,
    wait_for_line,
)

pytestmark = pytest.mark.cluster

TRAINING = textwrap.dedent("""
    import os, sys, time
    import torch
    import torch.distributed as dist
    rank = int(os.environ["RANK"])
    if os.environ.get("LATE_RANK") == str(rank):
        time.sleep(120)   # the others wait for this rank at the rendezvous
    print(f"rank {rank} joining", flush=True)
    dist.init_process_group("gloo")
    crash_rank, crash_code = os.environ.get("CRASH_RANK"), int(os.environ.get("CRASH_CODE", "1"))
    for step in range(int(os.environ.get("STEPS", "10000"))):
        value = torch.ones(1)
        dist.all_reduce(value)
        print(f"rank {rank} step {step} sum {value.item():g}", flush=True)
        if crash_rank == str(rank) and step == 3:
            print(f"rank {rank} crashing with {crash_code}", flush=True)
            os._exit(crash_code)
        time.sleep(0.2)
    dist.destroy_process_group()
""")

SLEEPER = textwrap.dedent("""
    import os, signal, time
    rank = int(os.environ["RANK"])
    if os.environ.get("IGNORE_TERM") == str(rank):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"rank {rank} ready", flush=True)
    for i in range(int(os.environ.get("TICKS", "1200"))):
        print(f"rank {rank} tick {i}", flush=True)
        time.sleep(0.1)
""")


@pytest.fixture
def job(cluster, tmp_path: Path):
    """Write the scripts and a hostfile; return a function that starts `launch` with them."""
    (tmp_path / "training.py").write_text(TRAINING)
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=1)

    def start(run_id: str, *args: str, program: str = "training.py", env=None):
        env_args = [f"--env={name}={value}" for name, value in (env or {}).items()]
        return start_cli(
            [
                "launch",
                str(hostfile),
                "--run-dir",
                str(tmp_path / "runs"),
                "--run-id",
                run_id,
                "--color",
                "never",
                *env_args,
                *args,
                "--",
                program,
            ],
            cwd=tmp_path,
            env=cluster.environ(),
        )

    start.tmp = tmp_path
    start.hostfile = hostfile
    return start


def rank_log(job, run_id: str, rank: int) -> Path:
    return job.tmp / "runs" / run_id / "logs" / f"rank-{rank}.log"


def test_rank_crash_on_another_node_stops_everything_and_is_named(cluster, job) -> None:
    proc = job("crash", "--grace", "3", env={"CRASH_RANK": "2", "CRASH_CODE": "7"})
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 7, out
    node2 = cluster.nodes[2].name
    assert re.search(
        rf"job failed: rank 2 \(local rank 0\) on {node2} ended with exit code 7 "
        r"after [\d.]+ s \(the first rank to fail\)",
        out,
    ), out
    summary = out[out.index("job failed") :]
    assert "rank 2 crashing with 7" in summary
    status = status_of(job.tmp / "runs", "crash")
    ranks = {r["rank"]: r for r in status["ranks"]}
    assert ranks[2]["state"] == "failed" and ranks[2]["exit_code"] == 7
    assert status["state"] == "failed" and status["exit_code"] == 7
    assert_nothing_left("crash")


@pytest.mark.parametrize("phase", ["rendezvous", "training"])
def test_ctrl_c_stops_every_node(cluster, job, phase: str) -> None:
    run_id = f"ctrlc-{phase}"
    if phase == "rendezvous":
        proc = job(run_id, env={"LATE_RANK": "2"})
        wait_for_line(rank_log(job, run_id, 1), "rank 1 joining", 90)
        time.sleep(1)  # ranks 0 and 1 now wait for rank 2 in init_process_group
    else:
        proc = job(run_id)
        wait_for_line(rank_log(job, run_id, 2), "rank 2 step 3", 90)
    assert run_pids(run_id), "the run must be running before Ctrl-C"
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert time.monotonic() - sent < 12, "ranks that exit on SIGTERM must not wait for SIGKILL"
    assert status_of(job.tmp / "runs", run_id)["state"] == "stopped"
    assert_nothing_left(run_id, within=2)


def test_killed_controller_leaves_nothing_behind(cluster, job) -> None:
    proc = job("orphaned", "--grace", "2")
    wait_for_line(rank_log(job, "orphaned", 2), "rank 2 step 2", 90)
    proc.kill()
    proc.wait()
    # Each agent sees its connection close and stops its own node: bounded by the grace.
    assert_nothing_left("orphaned", within=10)


def test_lost_node_is_named_and_the_rest_is_stopped(cluster, job) -> None:
    lost = cluster.nodes[2]
    proc = job("linkdown", "--grace", "2", "--heartbeat-timeout", "4")
    wait_for_line(rank_log(job, "linkdown", 2), "rank 2 step 2", 90)
    with cluster.link_cut(lost):
        cut = time.monotonic()
        out, _ = proc.communicate(timeout=60)
        noticed = time.monotonic() - cut
        assert proc.returncode == 1, out
        assert f"{lost.name}: lost: no word from its agent" in out
        assert f"job failed: node {lost.name} was lost" in out
        assert noticed < 4 + 2 + 10, f"took {noticed:.1f} s to notice and stop"
        # The cut-off node stops its own part once it has not heard from the controller.
        assert_nothing_left("linkdown", within=4 + 2 + 6)
    status = status_of(job.tmp / "runs", "linkdown")
    assert status["state"] == "lost"
    assert {n["host"]: n["state"] for n in status["nodes"]}[lost.name] == "lost"


def test_node_whose_sshd_dies_is_named_and_nothing_is_left(cluster, job) -> None:
    victim = cluster.nodes[1]
    proc = job("sshdkill", "--grace", "2")
    wait_for_line(rank_log(job, "sshdkill", 1), "rank 1 step 2", 90)
    try:
        cluster.kill_sshd(victim, sessions=True)
        out, _ = proc.communicate(timeout=60)
    finally:
        cluster.start_sshd(victim)
    assert proc.returncode == 1, out
    assert f"{victim.name}: lost: its agent ended without reporting" in out
    assert_nothing_left("sshdkill", within=8)


def test_stopping_one_run_leaves_another_on_the_same_nodes_alone(cluster, job) -> None:
    runs = ["--run-dir", str(job.tmp / "runs")]
    env = cluster.environ()
    for run_id in ("first", "second"):
        started = job(run_id, "--detach", program="sleeper.py")
        out, _ = started.communicate(timeout=120)
        assert started.returncode == 0, out
    for run_id in ("first", "second"):
        wait_for_line(rank_log(job, run_id, 2), "rank 2 ready", 90)
    follower = start_cli(["logs", "first", "-f", "--node", cluster.nodes[1].name, *runs], env=env)
    status = run_cli(["status", "first", *runs], env=env)
    assert re.search(rf"^1\s+{cluster.nodes[1].name}\s+running", status.stdout, re.M), status.stdout
    second_pids = set(run_pids("second"))
    assert second_pids

    stopped = run_cli(["stop", "first", *runs], env=env)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert_nothing_left("first", within=5)
    assert second_pids <= set(run_pids("second")), "the other run must be untouched"
    followed, _ = follower.communicate(timeout=30)  # ends by itself with the run
    assert f"[{cluster.nodes[1].name} r1] rank 1 ready" in followed
    assert f"[{cluster.nodes[0].name} r0]" not in followed
    assert status_of(job.tmp / "runs", "first")["state"] == "stopped"
    assert status_of(job.tmp / "runs", "second")["state"] == "running"

    assert run_cli(["stop", "second", *runs], env=env).returncode == 0
    assert status_of(job.tmp / "runs", "second")["state"] == "stopped"
    assert_nothing_left("second")


def test_rank_ignoring_sigterm_is_killed_after_the_grace(cluster, job) -> None:
    proc = job("stubborn", "--grace", "3", program="sleeper.py", env={"IGNORE_TERM": "1"})
    wait_for_line(rank_log(job, "stubborn", 1), "rank 1 tick 2", 90)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    assert proc.returncode == 130, out
    assert 3 <= took < 3 + 6, f"stop took {took:.1f} s with a 3 s grace"
    assert re.search(rf"{cluster.nodes[1].name}: SIGKILL to \d+ process", out), out
    ranks = {r["rank"]: r for r in status_of(job.tmp / "runs", "stubborn")["ranks"]}
    assert ranks[1]["state"] == "killed"
    assert ranks[0]["state"] == "stopped" and ranks[0]["exit_code"] == 143
    assert_nothing_left("stubborn", within=2)


def test_chatty_ranks_lose_no_line_and_splice_none(cluster, tmp_path: Path) -> None:
    lines = 20000
    script = SPLICE.replace("LINES", str(lines)).replace("MAXLEN", "300")
    (tmp_path / "chatty.py").write_text(script)
    hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=2)
    done = run_cli(
        [
            "launch",
            str(hostfile),
            "--run-dir",
            str(tmp_path / "runs"),
            "--run-id",
            "chatty",
            "--color",
            "never",
            "--",
            "chatty.py",
        ],
        cwd=tmp_path,
        env=cluster.environ(),
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr
    logs = tmp_path / "runs" / "chatty" / "logs"
    combined = (logs / "combined.log").read_text().splitlines()
    for rank in range(6):
        check_lines((logs / f"rank-{rank}.log").read_text().splitlines(), rank, lines)
        prefix = f"[{cluster.nodes[rank // 2].name} r{rank}] "
        check_lines([x[len(prefix) :] for x in combined if x.startswith(prefix)], rank, lines)
    assert_nothing_left("chatty")
