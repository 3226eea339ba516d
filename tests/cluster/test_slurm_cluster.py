"""`--backend slurm` on a real SLURM cluster over the lab's namespace nodes: jobs that run,
fail, are cancelled, or are submitted by hand or over a login node.

Every test drives the CLI as a user would and ends by checking that SLURM no longer lists
the job and that no process of the run (ORCHESTRATOR_RUN_ID=<run id>) is left on any node.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import run_on_terminal
from tests.lab.slurm import SlurmCluster
from tests.slurm_helpers import (  # noqa: F401 (fixtures, used by name)
    assert_gone,
    combined,
    command,
    job_id_in,
    launch_args,
    no_job_outlives_its_test,
    orchestrator,
    status_of,
    wait_for,
    work,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slurm]


def test_two_node_ddp_all_reduce(slurm_cluster: SlurmCluster, work: Path) -> None:
    done = orchestrator(
        slurm_cluster,
        work,
        *launch_args(
            work,
            "ddp",
            "--nodes",
            "2",
            "--nproc-per-node",
            "2",
            "--partition",
            "debug",
            "--",
            "all_reduce.py",
        ),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = job_id_in(done.stdout)
    assert "run ddp: SLURM job" in done.stdout and "run ddp succeeded" in done.stdout
    status = status_of(work, "ddp")
    hosts = [node["host"] for node in status["nodes"]]
    assert (status["backend"], status["slurm_job_id"], status["state"]) == (
        "slurm",
        job_id,
        "succeeded",
    )
    assert [r["state"] for r in status["ranks"]] == ["succeeded"] * 4
    for rank in range(4):  # one attributed stream, and a file per rank
        host = hosts[rank // 2]
        line = f"[{host} r{rank}] rank {rank}/4 on {host}: all_reduce 10 expected 10"
        assert line in done.stdout
        log = (work / "runs" / "ddp" / "logs" / f"rank-{rank}.log").read_text()
        assert f"rank {rank}/4 on {host}: all_reduce 10" in log
    assert len(set(hosts)) == 2
    assert_gone(slurm_cluster, job_id, "ddp")


def test_a_trainer_job_is_watched_live_with_a_footer_metrics_and_top(
    slurm_cluster: SlurmCluster, work: Path
) -> None:
    """A SLURM run is seen as an SSH one is: on a terminal the launch keeps its footer under
    the stream; metrics.jsonl holds every rank's records (the follower tails the files on
    the shared file system); `top --once` prints every rank with its last step."""
    argv = command(
        *launch_args(
            work, "watched", "--nodes", "2", "--nproc-per-node", "2", "--partition", "debug",
            "--", "-m", "orchestrator.trainer", "--synthetic-samples", "4096", "--epochs", "12",
            "--no-eval", "--log-every", "100",
        )
    )  # fmt: skip
    code, raw = run_on_terminal(argv, cwd=work, env=slurm_cluster.environ(), timeout=240)
    assert code == 0, raw.decode(errors="replace")
    footer = rb"\[orchestrator\] running, 4 rank\(s\) on 2 node\(s\) [^\r\n]*, step \d+"
    assert re.search(footer, raw), raw.decode(errors="replace")[-3000:]
    runs = work / "runs"
    records = [json.loads(line) for line in (runs / "watched" / "metrics.jsonl").open()]
    assert {r["rank"] for r in records if "step" in r.get("metrics", {})} == {0, 1, 2, 3}
    once = orchestrator(slurm_cluster, work, "top", "watched", "--run-dir", str(runs), "--once")
    assert once.returncode == 0, once.stderr
    rows = re.findall(r"^\s*(\d+)\s+\S+\s+succeeded\s+(\d+)\s", once.stdout, re.M)
    assert sorted(int(rank) for rank, _ in rows) == [0, 1, 2, 3], once.stdout
    assert all(int(step) > 0 for _, step in rows), once.stdout
    assert_gone(slurm_cluster, job_id_in(raw.decode(errors="replace")), "watched")


def test_rendered_script_submitted_by_hand(slurm_cluster: SlurmCluster, work: Path) -> None:
    done = orchestrator(
        slurm_cluster,
        work,
        "render",
        "--backend",
        "slurm",
        "--nodes",
        "2",
        "--partition",
        "debug",
        "-o",
        "out",
        "--run-id",
        "byhand",
        "--",
        "all_reduce.py",
    )
    assert done.returncode == 0, done.stderr
    script = work / "out" / "job.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    job_id = slurm_cluster.sbatch(script, cwd=work)
    info = slurm_cluster.wait_job(job_id, timeout=150)
    output = (work / f"slurm-{job_id}.out").read_text()
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), output
    nodes = re.findall(r"rank \d/2 on (\S+): all_reduce 3 expected 3", output)
    assert len(set(nodes)) == 2, output
    assert_gone(slurm_cluster, job_id, "byhand")


def test_failing_rank_ends_the_job_and_is_named(slurm_cluster: SlurmCluster, work: Path) -> None:
    done = orchestrator(
        slurm_cluster,
        work,
        *launch_args(
            work,
            "fail",
            "--nodes",
            "2",
            "--nproc-per-node",
            "2",
            "--env",
            "FAIL_RANK=3",
            "--",
            "ranks.py",
        ),
    )
    job_id = job_id_in(done.stdout)
    status = status_of(work, "fail")
    host = status["nodes"][1]["host"]
    assert done.returncode == 3, done.stdout + done.stderr
    assert f"job failed: rank 3 (local rank 1) on {host} ended with exit code 3" in done.stdout
    assert "rank 3 fails now" in done.stdout.split("job failed:")[1]
    assert status["state"] == "failed" and status["exit_code"] == 3
    assert status["ranks"][3]["state"] == "failed"
    assert {r["state"] for r in status["ranks"][:3]} <= {"stopped", "killed"}
    assert_gone(slurm_cluster, job_id, "fail")


def test_ctrl_c_cancels_the_job_everywhere(slurm_cluster: SlurmCluster, work: Path) -> None:
    proc = subprocess.Popen(
        command(
            *launch_args(work, "cc", "--nodes", "2", "--nproc-per-node", "2", "--", "ranks.py")
        ),
        cwd=work,
        env=slurm_cluster.environ(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: combined(work, "cc").count(" up on ") == 4, 120, "4 ranks up")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    job_id = job_id_in(out)
    assert proc.returncode == 130, out
    assert f"SIGINT: cancelling SLURM job {job_id} (scancel" in out
    assert status_of(work, "cc")["state"] == "stopped"
    assert_gone(slurm_cluster, job_id, "cc")


def test_detached_job_over_a_login_node(slurm_cluster: SlurmCluster, work: Path) -> None:
    """Submitted, followed and stopped over the login node; its node agents reached
    through srun there (stacks)."""
    login = slurm_cluster.nodes[-1].name
    done = orchestrator(
        slurm_cluster,
        work,
        *launch_args(work, "det", "--nodes", "2", "--login", login, "--detach", "--", "ranks.py"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = job_id_in(done.stdout)
    assert f"run det: SLURM job {job_id} submitted" in done.stdout
    run = ["--run-dir", str(work / "runs")]
    wait_for(lambda: combined(work, "det").count(" up on ") == 2, 120, "2 ranks up")
    shown = orchestrator(slurm_cluster, work, "status", "det", *run)
    assert "run det: running" in shown.stdout
    assert f"slurm job {job_id}: RUNNING, via {login}" in shown.stdout
    # The node agents are reached through srun on the login node: stacks of both ranks.
    stacks = orchestrator(slurm_cluster, work, "stacks", "det", *run, timeout=60)
    assert stacks.returncode == 0, stacks.stdout + stacks.stderr
    assert "stacks of 2 rank(s) taken" in stacks.stdout, stacks.stdout
    assert "main thread in <module> (ranks.py:" in stacks.stdout, stacks.stdout
    assert "no way to its agent" not in combined(work, "det")
    follow = subprocess.Popen(
        command("logs", "det", "-f", *run),
        cwd=work,
        env=slurm_cluster.environ(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        stopped = orchestrator(slurm_cluster, work, "stop", "det", *run)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert f"cancelled SLURM job {job_id} (scancel)" in stopped.stdout
        followed, _ = follow.communicate(timeout=30)  # ends with the run
    finally:
        follow.kill()
    assert " r1] rank 1 up on " in followed and "CANCELLED" in followed
    status = status_of(work, "det")
    assert (status["state"], status["slurm_state"]) == ("stopped", "CANCELLED")
    assert "run det: stopped" in orchestrator(slurm_cluster, work, "status", "det", *run).stdout
    assert_gone(slurm_cluster, job_id, "det")


def test_sbatch_rejections_are_bad_input(slurm_cluster: SlurmCluster, work: Path) -> None:
    done = orchestrator(
        slurm_cluster,
        work,
        *launch_args(work, "badpart", "--nodes", "1", "--partition", "nosuch", "--", "ranks.py"),
    )
    script = work / "runs" / "badpart" / "job.sbatch"
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"sbatch rejected {script}" in done.stderr
    assert "invalid partition specified: nosuch" in done.stderr
    assert "Traceback" not in done.stderr

    done = orchestrator(
        slurm_cluster, work, *launch_args(work, "toomany", "--nodes", "4", "--", "ranks.py")
    )  # sbatch accepts, never runs
    assert done.returncode == 2, done.stdout + done.stderr
    job_id = job_id_in(done.stdout)
    # SLURM says PartitionNodeLimit or PartitionConfig, depending on its scheduling pass
    assert re.search(
        rf"SLURM will not start job {job_id}: Partition(NodeLimit|Config) \(it .*"
        r"\); cancelled it",
        done.stderr,
    ), done.stderr
    assert str(work / "runs" / "toomany" / "job.sbatch") in done.stderr
    assert status_of(work, "toomany")["state"] == "failed"
    assert_gone(slurm_cluster, job_id, "toomany")


def test_missing_commands_and_unreachable_controller(
    slurm_cluster: SlurmCluster, work: Path
) -> None:
    bare = slurm_cluster.environ({"PATH": str(Path(sys.executable).parent)})
    done = orchestrator(
        slurm_cluster, work, *launch_args(work, "nocmd", "--nodes", "1", "--", "ranks.py"), env=bare
    )
    assert done.returncode == 2, done.stderr
    assert "sbatch: command not found" in done.stderr and "Traceback" not in done.stderr

    conf = work / "slurm.conf"  # the same cluster, at a port where nothing listens
    text = slurm_cluster.conf_path.read_text()
    text = re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=9", text)
    conf.write_text(re.sub(r"(?m)^MessageTimeout=.*$", "MessageTimeout=2", text))
    (work / "cgroup.conf").write_text((slurm_cluster.dir / "cgroup.conf").read_text())
    done = orchestrator(
        slurm_cluster,
        work,
        *launch_args(work, "noctld", "--nodes", "1", "--", "ranks.py"),
        env=slurm_cluster.environ({"SLURM_CONF": str(conf)}),
    )
    assert done.returncode == 1, done.stderr
    assert "cannot reach the SLURM controller" in done.stderr
    assert "Traceback" not in done.stderr
