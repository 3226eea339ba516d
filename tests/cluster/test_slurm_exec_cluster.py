"""`orchestrator exec --run RUN` on the lab's SLURM: with a 2-node job running (ranks that
sleep), a command printing the node's SLURM name runs once on each node, each line
attributed to the node it came from, exit 0; a command that fails on the second node only
gives exit 1 and a table naming that node; Ctrl-C ends the step with nothing of it left on
any node; the run is then stopped and gone."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.lab.slurm import SlurmCluster
from tests.slurm_helpers import (  # noqa: F401 (fixtures, used by name)
    assert_gone,
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

RUN = "sleepy"


def exec_on_run(slurm: SlurmCluster, work: Path, line: str) -> subprocess.CompletedProcess[str]:
    runs = str(work / "runs")
    args = ("exec", "--run", RUN, "--run-dir", runs, "--color", "never", "--", line)
    return orchestrator(slurm, work, *args, timeout=30)


def test_exec_on_the_nodes_of_a_running_slurm_run(slurm_cluster: SlurmCluster, work: Path) -> None:
    runs = str(work / "runs")
    launched = orchestrator(
        slurm_cluster,
        work,
        *launch_args(work, RUN, "--nodes", "2", "--nproc-per-node", "1", "--partition", "debug"),
        "--detach",
        "--",
        str(work / "ranks.py"),
        timeout=60,
    )
    assert launched.returncode == 0, launched.stdout + launched.stderr
    job_id = job_id_in(launched.stdout)
    try:
        wait_for(lambda: status_of(work, RUN).get("state") == "running", 40, "the job to run")
        nodelist = slurm_cluster.run(["squeue", "-h", "-j", str(job_id), "-o", "%N"]).stdout
        hosts = slurm_cluster.run(["scontrol", "show", "hostnames", nodelist.strip()]).stdout
        first, second = hosts.split()

        asked = time.monotonic()
        shown = exec_on_run(slurm_cluster, work, 'echo "node is $SLURMD_NODENAME"')
        print(f"exec --run on 2 nodes: {time.monotonic() - asked:.2f} s\n{shown.stdout}")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        lines = shown.stdout.splitlines()
        assert f"[{first}] node is {first}" in lines and f"[{second}] node is {second}" in lines
        assert sum("node is" in line for line in lines) == 2, shown.stdout
        assert "2 of 2 node(s) succeeded" in shown.stdout

        failing = exec_on_run(
            slurm_cluster, work, f'[ "$SLURMD_NODENAME" != {second} ] || exit 3; echo fine'
        )
        print(failing.stdout, failing.stderr)
        assert failing.returncode == 1, failing.stdout + failing.stderr
        table = failing.stdout.splitlines()
        assert f"{first}  ok" in [line.rstrip() for line in table], failing.stdout
        assert any(line.split() == [second, "exit", "code", "3"] for line in table), table
        assert f"[{first}] fine" in table and f"[{second}] fine" not in table
        assert "1 of 2 node(s) succeeded" in failing.stdout

        sleeping = subprocess.Popen(
            command("exec", "--run", RUN, "--run-dir", runs, "--", "sleep 300"),
            cwd=work,
            env=slurm_cluster.environ(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            sleeps = lambda: [  # noqa: E731
                p
                for p in slurm_cluster.cluster.processes_with_env("ORCHESTRATOR_EXEC", RUN)
                if p.command.startswith("sleep")
            ]
            wait_for(lambda: len(sleeps()) == 2, 20, "sleep on both nodes")
            interrupted = time.monotonic()
            sleeping.send_signal(signal.SIGINT)
            out, _ = sleeping.communicate(timeout=20)
            print(f"Ctrl-C to exit: {time.monotonic() - interrupted:.2f} s")
        finally:
            if sleeping.poll() is None:
                sleeping.kill()
        print(out)
        assert sleeping.returncode == 130, out
        assert "SIGINT during the command" in out
        wait_for(
            lambda: not slurm_cluster.cluster.processes_with_env("ORCHESTRATOR_EXEC", RUN),
            5,
            "nothing of the step left on the nodes",
        )
        assert status_of(work, RUN)["state"] == "running"  # the job itself goes on
    finally:
        stopped = orchestrator(slurm_cluster, work, "stop", RUN, "--run-dir", runs, timeout=60)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert_gone(slurm_cluster, job_id, RUN)
    ended = exec_on_run(slurm_cluster, work, "true")
    assert ended.returncode == 2, ended.stdout + ended.stderr
    assert f"run {RUN} has ended (stopped)" in ended.stderr
