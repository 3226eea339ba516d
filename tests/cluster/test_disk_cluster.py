"""A node's disk on the namespace cluster: a node whose run directory is a 2 MiB tmpfs is
warned about before the start and named, with "no space", when its ranks fill it; the
nodes' copies of a run go once it succeeded, stay after a failure, and `orchestrator clean`
removes the copies of ended runs, never those of a run still running."""

from __future__ import annotations

import shlex
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.cli_helpers import assert_nothing_left, run_cli, start_cli, status_of, wait_until
from tests.lab import bad_days

pytestmark = pytest.mark.cluster

# Rank CHATTY prints 4 KiB lines as fast as it can (its node's disk fills within a second
# of 2 MiB); the others print a line and sleep SLEEP s; rank FAIL_RANK exits 3 at once.
JOB = textwrap.dedent("""
    import os, sys, time
    rank = int(os.environ["RANK"])
    print(f"rank {rank} started", flush=True)
    if os.environ.get("FAIL_RANK") == str(rank):
        sys.exit(3)
    if os.environ.get("CHATTY") == str(rank):
        line = "x" * 4095
        for i in range(2000):  # 8 MiB: more than the disk, never a flood if it is not full
            print(line, flush=True)
    time.sleep(float(os.environ.get("SLEEP", "0")))
    print(f"rank {rank} done", flush=True)
""")


@pytest.fixture
def job(tmp_path: Path, cluster):
    (tmp_path / "job.py").write_text(JOB)
    hostfile = cluster.write_hostfile(tmp_path / "hosts.txt", slots=1)

    def argv(run_id: str, *args: str, env=None) -> list[str]:
        env_args = [f"--env={name}={value}" for name, value in (env or {}).items()]
        return [
            "launch", str(hostfile), "--run-dir", str(tmp_path / "runs"), "--run-id", run_id,
            "--color", "never", "--grace", "3", *env_args, *args, "--", "job.py",
        ]  # fmt: skip

    def run(run_id: str, *args: str, env=None):
        return run_cli(argv(run_id, *args, env=env), cwd=tmp_path, env=cluster.environ())

    def start(run_id: str, *args: str, env=None):
        return start_cli(argv(run_id, *args, env=env), cwd=tmp_path, env=cluster.environ())

    run.start = start
    run.runs = tmp_path / "runs"
    run.hostfile = hostfile
    run.tmp = tmp_path
    return run


def node_runs(cluster) -> Path:
    """~/.orchestrator/runs of every node: the nodes share the machine's file systems, and
    their logins get the user's home (the lab's home holds only the controller's ssh)."""
    code, out, err = cluster.ssh_run(cluster.nodes[0], "echo $HOME")
    assert code == 0, err
    return Path(out.strip()) / ".orchestrator" / "runs"


def test_a_full_disk_on_a_node_is_named_and_warned_about(cluster, job) -> None:
    run_id = "disk-full"
    victim = cluster.nodes[1]
    with bad_days.small_disk(cluster, victim, node_runs(cluster), "2m"):
        result = job(run_id, env={"CHATTY": "1", "SLEEP": "120"})
    full = result.stdout + result.stderr
    out = "\n".join(line[:200] for line in full.splitlines())  # for messages: no 4 KiB lines
    assert result.returncode == 1, out
    where = f"~/.orchestrator/runs/{run_id}/node1"
    # Before the start: the preflight saw 2 MiB free there.
    assert f"warning: {victim.name}: only 2.0M free in " in full, out
    assert "--min-free-disk 1G" in full, out
    assert f"job failed: {victim.name}: no space left on device in {where}" in full, out
    status = status_of(job.runs, run_id)
    assert status["state"] == "failed" and status["exit_code"] == 1, status
    assert status["summary"].startswith(f"job failed: {victim.name}: no space left"), status
    node = {n["host"]: n for n in status["nodes"]}[victim.name]
    assert node["detail"] == f"no space left on device in {where}", status
    assert all(r["state"] != "succeeded" for r in status["ranks"]), status
    assert_nothing_left(run_id)


def test_node_copies_go_after_success_stay_after_failure_and_clean_removes_them(
    cluster, job
) -> None:
    copies = node_runs(cluster)
    tag = uuid.uuid4().hex[:6]  # nothing an earlier session left can pass for these runs
    ok_id, kept_id, failed_id, running_id = (
        f"copies-{w}-{tag}" for w in ("ok", "kept", "failed", "running")
    )
    # The nodes' python, through a wrapper that notes each agent it starts (node, tag).
    agents = job.tmp / "agents.txt"
    python = job.tmp / "python"
    python.write_text(
        "#!/bin/bash\n"
        'for word in "$@"; do if [ "$word" = orchestrator-agent ]; then\n'
        '    read -r _ _ node _ <<< "$SSH_CONNECTION"\n'
        f'    echo "$node ${{@: -1}}" >> {shlex.quote(str(agents))}\n'
        "fi; done\n"
        f'exec {shlex.quote(sys.executable)} "$@"\n'
    )
    python.chmod(0o755)
    ok = job(ok_id, "--python", str(python), env={"SLEEP": "0"})
    assert ok.returncode == 0, ok.stdout[-3000:]
    assert not (copies / ok_id).exists(), list((copies / ok_id).rglob("*"))
    assert status_of(job.runs, ok_id)["node_copies"] == "removed"
    # One agent per node did the preflight, the job and the removal: one login each.
    started = sorted(agents.read_text().split("\n")[:-1])
    assert started == sorted(f"{node.address} {ok_id}" for node in cluster.nodes), started

    kept = job(kept_id, "--keep-node-logs", env={"SLEEP": "0"})
    assert kept.returncode == 0, kept.stdout[-3000:]
    assert sorted(p.name for p in (copies / kept_id).iterdir()) == [
        "node0",
        "node1",
        "node2",
    ]
    assert (copies / kept_id / "node1" / "rank-1.out").read_text().startswith("rank 1")

    failed = job(failed_id, env={"FAIL_RANK": "2"})
    assert failed.returncode == 3, failed.stdout[-3000:]
    assert (copies / failed_id / "node2" / "rank-2.out").exists()
    assert status_of(job.runs, failed_id)["node_copies"].startswith("kept (the run failed")

    # A run still going on the nodes is never touched by clean.
    running = job.start(running_id, env={"SLEEP": "120"})
    try:
        rank_log = job.runs / running_id / "logs" / "rank-2.log"
        wait_until(
            lambda: rank_log.exists() and "rank 2 started" in rank_log.read_text(),
            120,
            "the running run's ranks to start",
        )
        dry = run_cli(["clean", str(job.hostfile), "--dry-run"], env=cluster.environ())
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert failed_id in dry.stdout and "would be removed" in dry.stdout, dry.stdout
        assert (copies / failed_id).exists()
        recent = run_cli(["clean", str(job.hostfile), "--older-than", "1d"], env=cluster.environ())
        assert recent.returncode == 0 and "removed 0 node copies" in recent.stdout, recent.stdout
        assert (copies / failed_id).exists()
        cleaned = run_cli(["clean", str(job.hostfile)], env=cluster.environ())
        assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
        assert "kept: the run is still running there" in cleaned.stdout, cleaned.stdout
        assert not (copies / failed_id).exists()
        assert not (copies / kept_id).exists()
        assert (copies / running_id / "node2" / "rank-2.out").exists()
        assert running.poll() is None, "clean must not disturb a running run"
    finally:
        stop = run_cli(["stop", running_id, "--run-dir", str(job.runs)], env=cluster.environ())
        running.wait(timeout=120)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert_nothing_left(running_id)


def test_clean_says_what_is_wrong_with_its_input(cluster, job) -> None:
    bad = run_cli(["clean", str(job.hostfile), "--older-than", "soon"], env=cluster.environ())
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "--older-than: 'soon' is not an age; write e.g. 7d, 12h, 30m or 0" in bad.stderr
    assert "Traceback" not in bad.stderr
