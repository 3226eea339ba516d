"""Jobs in a container, on the namespace cluster with podman and an image built here
(tests/lab/containers.py): torchrun and the ranks run inside the image, the agent on the
host. A 3-node probe reports from inside; a failing rank, Ctrl-C and `stop` end the run
with the exit codes of a run without a container, and leave no container and no process,
nor does a controller killed outright (its nodes' agents stop by themselves);
a secret is in no `ps` line and in no `podman inspect`; `check` runs inside the image."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.cli_helpers import (
    REPO,
    assert_nothing_left,
    run_cli,
    start_cli,
    status_of,
    wait_ready,
    wait_until,
)
from tests.lab.cluster import Cluster
from tests.lab.containers import containers_named, podman

pytestmark = pytest.mark.cluster

SECRET = "s3cr3t-value-for-the-container-test"

PROBE = textwrap.dedent("""
    import json, os, sys, time
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
             "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
    report = {
        "in_image": os.path.exists("/run/.containerenv"),
        "env": {name: os.environ.get(name) for name in names},
        "secret": os.environ.get("JOB_SECRET") == open("expected").read(),
        "sum": total.item(),
        "python": sys.executable,
        "uid": os.getuid(),
    }
    with open(f"report-{rank}.json", "w") as handle:
        json.dump(report, handle)
    print("reported", flush=True)
    if os.environ.get("HOLD"):  # until the test has looked at ps and podman inspect
        while not os.path.exists("release"):
            time.sleep(0.2)
    dist.destroy_process_group()
""")

FAILS = textwrap.dedent("""
    import os, sys, time
    print("started", flush=True)
    if os.environ["RANK"] == "1":
        sys.exit(3)
    time.sleep(300)
""")

SLEEPS = textwrap.dedent("""
    import os, time
    print(f"rank {os.environ['RANK']} ready", flush=True)
    time.sleep(600)
""")


@pytest.fixture(scope="module")
def nodes(container_cluster: tuple[Cluster, str]) -> Cluster:
    return container_cluster[0]


@pytest.fixture(scope="module")
def image(container_cluster: tuple[Cluster, str]) -> str:
    return container_cluster[1]


def launch_argv(hostfile: Path, runs: Path, run_id: str, image: str, *rest: str) -> list[str]:
    return [
        "launch", str(hostfile), "--run-dir", str(runs), "--run-id", run_id,
        "--color", "never", "--grace", "5", "--container", image,
        "--container-runtime", "podman", *rest,
    ]  # fmt: skip


def assert_no_container(run_id: str) -> None:
    wait_until(
        lambda: not containers_named(f"orchestrator-{run_id}-"),
        30,
        f"the containers of run {run_id} to be removed",
    )


def test_a_three_node_job_runs_inside_the_image(nodes: Cluster, image: str, tmp_path: Path):
    (tmp_path / "probe.py").write_text(PROBE)
    hostfile = nodes.write_hostfile(tmp_path / "hosts.txt", slots=2)
    runs, run_id = tmp_path / "runs", "inside"
    (tmp_path / "secret.env").write_text(f"JOB_SECRET={SECRET}\n")
    (tmp_path / "expected").write_text(SECRET)
    argv = launch_argv(hostfile, runs, run_id, image, "--env-file", "secret.env")
    argv += ["--secret-env", "JOB_SECRET", "--env", "HOLD=1", "--", "probe.py"]
    env = nodes.environ()
    proc = start_cli(argv, cwd=tmp_path, env=env)
    try:
        wait_until(
            lambda: len(list(tmp_path.glob("report-*.json"))) == 6 or proc.poll() is not None,
            240,
            "six ranks to report",
        )
        assert proc.poll() is None, proc.communicate()[0]
        names = containers_named(f"orchestrator-{run_id}-")
        assert sorted(names) == [f"orchestrator-{run_id}-node{k}" for k in range(3)], names
        inspected = podman("inspect", *names).stdout
        assert SECRET not in inspected
        assert json.loads(inspected)[0]["HostConfig"]["NetworkMode"] == "host"
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert SECRET not in ps
        # the ranks' stacks from the host: the hook's signal reaches a process in the
        # container's own pid namespace (its files named by the pid it sees)
        shown = run_cli(
            ["stacks", run_id, "--run-dir", str(runs), "--method", "signal"], env=env, timeout=60
        )
        assert shown.returncode == 0 and "6 ranks: main thread in <module> (probe.py:" in (
            shown.stdout
        ), shown.stdout + shown.stderr
        (tmp_path / "release").touch()
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    print(out)
    assert proc.returncode == 0, out
    assert "3 node(s): podman, in the image: python" in out, out
    reports = [json.loads((tmp_path / f"report-{r}.json").read_text()) for r in range(6)]
    master = nodes.nodes[0].address
    for rank, report in enumerate(reports):
        assert report["in_image"], report
        assert report["secret"], report
        assert report["sum"] == 21.0, report  # 1 + 2 + ... + 6, exactly
        assert report["uid"] == os.getuid()
        expected = {"RANK": str(rank), "WORLD_SIZE": "6", "LOCAL_RANK": str(rank % 2)}
        assert {k: report["env"][k] for k in expected} == expected, report
        assert report["env"]["MASTER_ADDR"] == master, report
        assert report["env"]["NCCL_SOCKET_IFNAME"] == "eth0", report
        assert report["env"]["GLOO_SOCKET_IFNAME"] == "eth0", report
    assert (tmp_path / "report-0.json").stat().st_uid == os.getuid()
    assert_no_container(run_id)
    assert_nothing_left(run_id)
    for kept in (runs / run_id).rglob("*"):
        assert not kept.is_file() or SECRET.encode() not in kept.read_bytes(), kept


def test_a_failing_rank_ctrl_c_stop_and_a_lost_controller_leave_no_container(
    nodes: Cluster, image: str, tmp_path: Path
):
    (tmp_path / "fails.py").write_text(FAILS)
    (tmp_path / "sleeps.py").write_text(SLEEPS)
    hostfile = nodes.write_hostfile(tmp_path / "hosts.txt", slots=1)
    runs, env = tmp_path / "runs", nodes.environ()

    absent = run_cli(
        [*launch_argv(hostfile, runs, "absent", "localhost/absent:1"), "--", "fails.py"],
        cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert absent.returncode == 2, absent.stdout + absent.stderr
    said = [line for line in absent.stderr.splitlines() if "localhost/absent:1" in line]
    assert len(said) == 1 and "is not on this node" in said[0], absent.stderr
    assert "(3 nodes)" in said[0], said  # one line for the three, folded
    assert "Traceback" not in absent.stderr and not containers_named("orchestrator-absent-")

    failed = run_cli(
        [*launch_argv(hostfile, runs, "fails", image), "--", "fails.py"],
        cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    print(failed.stdout)
    assert failed.returncode == 3, failed.stdout + failed.stderr
    assert "rank 1 on" in failed.stdout and "exit code 3" in failed.stdout
    assert_no_container("fails")
    assert_nothing_left("fails")

    ends = [("ctrl-c", signal.SIGINT, 130), ("stopped", None, 143)]
    ends.append(("lost", signal.SIGKILL, -signal.SIGKILL))  # the agents stop by themselves
    for run_id, how, code in ends:
        proc = start_cli(
            [*launch_argv(hostfile, runs, run_id, image), "--", "sleeps.py"], cwd=tmp_path, env=env
        )
        try:
            wait_ready(runs, run_id, 3, proc)
            assert len(containers_named(f"orchestrator-{run_id}-")) == 3
            if how is not None:
                proc.send_signal(how)
            else:
                stop = run_cli(["stop", run_id, "--run-dir", str(runs)], env=env, timeout=120)
                assert stop.returncode == 0, stop.stdout + stop.stderr
            out, _ = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        print(out)
        assert proc.returncode == code, out
        if how != signal.SIGKILL:
            assert status_of(runs, run_id)["state"] == "stopped", out
        assert_no_container(run_id)
        assert_nothing_left(run_id, within=30)


def test_check_takes_the_facts_and_runs_the_collectives_inside_the_image(
    nodes: Cluster, image: str, tmp_path: Path
):
    """The project is installed in the lab image's environment from its source folder
    (an editable install), so the image sees that folder as a mount, as a user's own
    development install would."""
    hostfile = nodes.write_hostfile(tmp_path / "hosts.txt", slots=1)
    argv = ["check", str(hostfile), "--run-dir", str(tmp_path / "runs"), "--skip-bandwidth"]
    argv += ["--run-id", "check-inside"]
    argv += ["--container", image, "--container-mounts", f"{REPO}:{REPO}:ro"]
    done = run_cli(argv, cwd=tmp_path, env=nodes.environ(), timeout=300)
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"python, torch, NCCL, CUDA, inside container {image} (" in done.stdout
    assert "all_reduce" in done.stdout and "RESULT: passed" in done.stdout
    record = tmp_path / "runs" / "check-inside"
    assert f"image: {image}" in (record / "plan.yaml").read_text()
    assert "orchestrator_in_container" in (record / "node0.sh").read_text()  # the job's script
    assert not containers_named("orchestrator-check-inside-")


def test_a_hang_in_the_container_is_named_by_stacks_and_the_flight_recorder(
    nodes: Cluster, image: str, tmp_path: Path
):
    """The hang checks reach ranks in the container's own pid namespace: their stacks, and
    torch's flight recorder dumped through the hook's pipe (named by the pid the rank sees)."""
    shutil.copy(REPO / "tests" / "data" / "hang_job.py", tmp_path / "hang_job.py")
    hostfile = nodes.write_hostfile(tmp_path / "hosts.txt", slots=1)
    runs = tmp_path / "runs"
    argv = [*launch_argv(hostfile, runs, "hung", image), "--hang-timeout", "10"]
    argv += ["--env", "STUCK_RANK=1", "--", "hang_job.py"]
    done = run_cli(argv, cwd=tmp_path, env=nodes.environ(), timeout=300)
    print(done.stdout)
    assert done.returncode == 1, done.stdout + done.stderr
    status = status_of(runs, "hung")
    assert status["state"] == "hung" and status["hang"]["stuck_ranks"] == [1], status
    assert "wait_for_a_batch_that_never_comes" in status["summary"], status["summary"]
    assert "flight recorder: rank 1 (" in status["summary"], status["summary"]
    assert_no_container("hung")
    assert_nothing_left("hung", within=30)
