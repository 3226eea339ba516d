"""`--backend slurm` on a real SLURM cluster over the lab's namespace nodes.

Every test drives the CLI as a user would and ends by checking that SLURM no longer lists
the job and that no process of the run (ORCHESTRATOR_RUN_ID=<run id>) is left on any node.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cli_helpers import REPO
from tests.lab.slurm import SlurmCluster
from tests.trainer_helpers import (
    CRASH_ONCE,
    CRASH_ONCE_ARGS,
    RESUME_TOLERANCE,
    load_weights,
    max_abs_difference,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slurm]

ALL_REDUCE = """\
import os
import torch
import torch.distributed as dist

if os.environ["RANK"] == os.environ.get("CRASH_ONCE_RANK") and \
        os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    print(f"rank {os.environ['RANK']} crashes once", flush=True)
    raise SystemExit(3)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
expected = world * (world + 1) / 2
print(f"rank {rank}/{world} on {os.environ['SLURMD_NODENAME']}: all_reduce {value.item():g} "
      f"expected {expected:g}", flush=True)
dist.destroy_process_group()
raise SystemExit(0 if value.item() == expected else 1)
"""
# No torch: fails (FAIL_RANK) or sleeps, quickly.
RANKS = """\
import os, sys, time
rank = int(os.environ["RANK"])
print(f"rank {rank} up on {os.environ['SLURMD_NODENAME']}", flush=True)
if rank == int(os.environ.get("FAIL_RANK", "-1")):
    print(f"rank {rank} fails now", flush=True)
    sys.exit(3)
time.sleep(300)
"""
# Waits for SIGUSR1, saves a "checkpoint" and exits 128+SIGUSR1; after a requeue, resumes.
CHECKPOINTING = """\
import os, signal, sys, time
from pathlib import Path
rank = int(os.environ["RANK"])
checkpoint = Path(sys.argv[1]) / f"rank-{rank}.ckpt"
if checkpoint.exists():
    print(f"rank {rank} resumed from {checkpoint.read_text()} "
          f"(restart {os.environ['SLURM_RESTART_COUNT']})", flush=True)
    raise SystemExit(0)
got = []
signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
print(f"rank {rank} waiting for SIGUSR1", flush=True)
while not got:
    time.sleep(0.05)
checkpoint.write_text(f"checkpoint {rank}")
print(f"rank {rank} got SIGUSR1", flush=True)
raise SystemExit(128 + signal.SIGUSR1)
"""


@pytest.fixture(autouse=True)
def no_job_outlives_its_test(slurm_cluster: SlurmCluster) -> Iterator[None]:
    """A test that fails part-way must not leave its job queued or running for the next:
    cancel whatever this private cluster still holds, and let the nodes go idle."""
    yield
    left = slurm_cluster.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
    if left:
        slurm_cluster.run(["scancel", "--signal=KILL", *left], check=False)
        slurm_cluster.wait_idle(timeout=60)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    for name, text in (("all_reduce.py", ALL_REDUCE), ("ranks.py", RANKS),
                       ("checkpointing.py", CHECKPOINTING)):
        (tmp_path / name).write_text(text)
    return tmp_path


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator", *args]


def orchestrator(slurm: SlurmCluster, cwd: Path, *args: str, timeout: float = 180,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command(*args), cwd=cwd, env=env or slurm.environ(),
                          capture_output=True, text=True, timeout=timeout)


def launch_args(work: Path, run_id: str, *args: str) -> list[str]:
    return ["launch", "--backend", "slurm", "--run-dir", str(work / "runs"), "--run-id", run_id,
            "--color", "never", *args]


def job_id_in(output: str) -> int:
    match = re.search(r"SLURM job (\d+) submitted", output)
    assert match, output
    return int(match.group(1))


def status_of(work: Path, run_id: str) -> dict:
    return json.loads((work / "runs" / run_id / "status.json").read_text())


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def combined(work: Path, run_id: str) -> str:
    path = work / "runs" / run_id / "logs" / "combined.log"
    return path.read_text(errors="replace") if path.exists() else ""


def assert_gone(slurm: SlurmCluster, job_id: int, run_id: str) -> None:
    """SLURM no longer lists the job and no process of the run is left on any node."""
    assert slurm.run(["squeue", "-h", "-j", str(job_id)]).stdout.strip() == ""
    deadline = time.monotonic() + 3
    while (left := slurm.cluster.processes_with_env("ORCHESTRATOR_RUN_ID", run_id)) and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], [p.command for p in left]


def test_two_node_ddp_all_reduce(slurm_cluster: SlurmCluster, work: Path) -> None:
    done = orchestrator(slurm_cluster, work, *launch_args(
        work, "ddp", "--nodes", "2", "--nproc-per-node", "2", "--partition", "debug", "--",
        "all_reduce.py"))
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = job_id_in(done.stdout)
    assert "run ddp: SLURM job" in done.stdout and "run ddp succeeded" in done.stdout
    status = status_of(work, "ddp")
    hosts = [node["host"] for node in status["nodes"]]
    assert (status["backend"], status["slurm_job_id"], status["state"]) == \
        ("slurm", job_id, "succeeded")
    assert [r["state"] for r in status["ranks"]] == ["succeeded"] * 4
    for rank in range(4):  # one attributed stream, and a file per rank
        host = hosts[rank // 2]
        line = f"[{host} r{rank}] rank {rank}/4 on {host}: all_reduce 10 expected 10"
        assert line in done.stdout
        log = (work / "runs" / "ddp" / "logs" / f"rank-{rank}.log").read_text()
        assert f"rank {rank}/4 on {host}: all_reduce 10" in log
    assert len(set(hosts)) == 2
    assert_gone(slurm_cluster, job_id, "ddp")


def test_rendered_script_submitted_by_hand(slurm_cluster: SlurmCluster, work: Path) -> None:
    done = orchestrator(slurm_cluster, work, "render", "--backend", "slurm", "--nodes", "2",
                        "--partition", "debug", "-o", "out", "--run-id", "byhand", "--",
                        "all_reduce.py")
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


def test_rendered_script_with_restarts_submitted_by_hand(slurm_cluster: SlurmCluster,
                                                         work: Path) -> None:
    """`render --backend slurm --max-restarts 1`: the c10d rendezvous across the allocation,
    a rank that crashes once, torchrun restarting both nodes' workers, the job completing."""
    done = orchestrator(slurm_cluster, work, "render", "--backend", "slurm", "--nodes", "2",
                        "--max-restarts", "1", "--env", "CRASH_ONCE_RANK=1", "-o", "out",
                        "--run-id", "byhand-restarts", "--", "all_reduce.py")
    assert done.returncode == 0, done.stderr
    job_id = slurm_cluster.sbatch(work / "out" / "job.sbatch", cwd=work)
    info = slurm_cluster.wait_job(job_id, timeout=150)
    output = (work / f"slurm-{job_id}.out").read_text()
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), output
    assert output.count("rank 1 crashes once") == 1, output
    after = output.split("rank 1 crashes once")[1]
    nodes = re.findall(r"rank (\d)/2 on (\S+): all_reduce 3 expected 3", after)
    assert sorted(rank for rank, _ in nodes) == ["0", "1"], output  # both ran again
    assert len({node for _, node in nodes}) == 2, output
    assert_gone(slurm_cluster, job_id, "byhand-restarts")


def test_failing_rank_ends_the_job_and_is_named(slurm_cluster: SlurmCluster,
                                                work: Path) -> None:
    done = orchestrator(slurm_cluster, work, *launch_args(
        work, "fail", "--nodes", "2", "--nproc-per-node", "2", "--env", "FAIL_RANK=3", "--",
        "ranks.py"))
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
        command(*launch_args(work, "cc", "--nodes", "2", "--nproc-per-node", "2", "--",
                             "ranks.py")),
        cwd=work, env=slurm_cluster.environ(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
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
    login = slurm_cluster.nodes[-1].name
    done = orchestrator(slurm_cluster, work, *launch_args(
        work, "det", "--nodes", "2", "--login", login, "--detach", "--", "ranks.py"))
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = job_id_in(done.stdout)
    assert f"run det: SLURM job {job_id} submitted" in done.stdout
    run = ["--run-dir", str(work / "runs")]
    wait_for(lambda: combined(work, "det").count(" up on ") == 2, 120, "2 ranks up")
    shown = orchestrator(slurm_cluster, work, "status", "det", *run)
    assert "run det: running" in shown.stdout
    assert f"slurm job {job_id}: RUNNING, via {login}" in shown.stdout
    follow = subprocess.Popen(command("logs", "det", "-f", *run), cwd=work,
                              env=slurm_cluster.environ(), stdout=subprocess.PIPE, text=True)
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
    done = orchestrator(slurm_cluster, work, *launch_args(
        work, "badpart", "--nodes", "1", "--partition", "nosuch", "--", "ranks.py"))
    script = work / "runs" / "badpart" / "job.sbatch"
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"sbatch rejected {script}" in done.stderr
    assert "invalid partition specified: nosuch" in done.stderr
    assert "Traceback" not in done.stderr

    done = orchestrator(slurm_cluster, work, *launch_args(
        work, "toomany", "--nodes", "4", "--", "ranks.py"))  # sbatch accepts, never runs
    assert done.returncode == 2, done.stdout + done.stderr
    job_id = job_id_in(done.stdout)
    # SLURM says PartitionNodeLimit or PartitionConfig, depending on its scheduling pass
    assert re.search(rf"SLURM will not start job {job_id}: Partition(NodeLimit|Config) \(it .*"
                     r"\); cancelled it", done.stderr), done.stderr
    assert str(work / "runs" / "toomany" / "job.sbatch") in done.stderr
    assert status_of(work, "toomany")["state"] == "failed"
    assert_gone(slurm_cluster, job_id, "toomany")


def test_missing_commands_and_unreachable_controller(slurm_cluster: SlurmCluster,
                                                     work: Path) -> None:
    bare = slurm_cluster.environ({"PATH": str(Path(sys.executable).parent)})
    done = orchestrator(slurm_cluster, work, *launch_args(
        work, "nocmd", "--nodes", "1", "--", "ranks.py"), env=bare)
    assert done.returncode == 2, done.stderr
    assert "sbatch: command not found" in done.stderr and "Traceback" not in done.stderr

    conf = work / "slurm.conf"  # the same cluster, at a port where nothing listens
    text = slurm_cluster.conf_path.read_text()
    text = re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=9", text)
    conf.write_text(re.sub(r"(?m)^MessageTimeout=.*$", "MessageTimeout=2", text))
    (work / "cgroup.conf").write_text((slurm_cluster.dir / "cgroup.conf").read_text())
    done = orchestrator(slurm_cluster, work, *launch_args(
        work, "noctld", "--nodes", "1", "--", "ranks.py"),
        env=slurm_cluster.environ({"SLURM_CONF": str(conf)}))
    assert done.returncode == 1, done.stderr
    assert "cannot reach the SLURM controller" in done.stderr
    assert "Traceback" not in done.stderr


def _requeued_job(work: Path, run_id: str) -> int:
    """Wait for the job's requeue; its id. (SLURM then holds it back for the lab's
    cred_expire, 20 s, before it starts again.)"""
    wait_for(lambda: "requeued" in combined(work, run_id), 150, "the requeue")
    return job_id_in(combined(work, run_id))


def test_signal_before_the_time_limit_checkpoints_and_requeues(
        slurm_cluster: SlurmCluster, work: Path) -> None:
    """SLURM itself sends SIGUSR1 100 s before a 3-minute limit, or up to 60 s earlier as
    its manual warns: 20-80 s in, once the ranks are up and have their handlers. They save
    and stop, the script requeues, the ranks resume."""
    (work / "ckpt").mkdir()
    proc = subprocess.Popen(
        command(*launch_args(work, "sig", "--nodes", "2", "--time", "3", "--signal", "USR1@100",
                             "--requeue", "--", "checkpointing.py", "ckpt")),
        cwd=work, env=slurm_cluster.environ(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    try:
        job_id = _requeued_job(work, "sig")
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert "SIGUSR1 from SLURM (time limit near): passing it to the ranks" in out
    for rank in (0, 1):
        got = out.index(f" r{rank}] rank {rank} got SIGUSR1")
        assert out.index(f" r{rank}] rank {rank} resumed from checkpoint {rank} (restart 1)") > got
    status = status_of(work, "sig")
    assert (status["state"], status["attempt"], status["slurm_state"]) == \
        ("succeeded", 1, "COMPLETED")
    assert_gone(slurm_cluster, job_id, "sig")


def test_bundled_trainer_checkpoints_on_the_signal_and_resumes(
        slurm_cluster: SlurmCluster, work: Path) -> None:
    """The documented recipe: --signal USR1@N --requeue, trainer --checkpoint-dir D --resume.
    SLURM's warning is sent here at once, as SLURM sends it (to the batch shell)."""
    proc = subprocess.Popen(
        command(*launch_args(work, "train", "--nodes", "2", "--signal", "USR1@300", "--requeue",
                             "--", "-m", "orchestrator.trainer", "--checkpoint-dir", "ckpt",
                             "--resume", "--epochs", "1000", "--log-every", "1")),
        cwd=work, env=slurm_cluster.environ(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    try:
        wait_for(lambda: re.search(r"r0\] step \d+/", combined(work, "train")), 150, "training")
        job_id = job_id_in(combined(work, "train"))
        slurm_cluster.run(["scancel", "--batch", "--signal=USR1", str(job_id)])
        _requeued_job(work, "train")
        wait_for(lambda: "resumed from" in combined(work, "train"), 150, "the resumed trainer")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    resumed = re.search(r"r0\] resumed from (\S+) at step (\d+)", out)
    assert resumed and int(resumed.group(2)) > 0, out
    assert (work / resumed.group(1)).is_file()
    assert proc.returncode == 130 and status_of(work, "train")["attempt"] == 1
    assert_gone(slurm_cluster, job_id, "train")


def test_a_rank_crashing_once_restarts_and_resumes_to_the_same_model(
        slurm_cluster: SlurmCluster, work: Path) -> None:
    """--max-restarts 1 through the sbatch script's c10d rendezvous: rank 1 crashes once after
    the first checkpoint, torchrun restarts the workers on both nodes, the job goes on, the
    trainer resumes and ends with the model of an uninterrupted run (2 local ranks: the same
    world size, quicker than a second SLURM job)."""
    trainer = ["--", str(CRASH_ONCE), *CRASH_ONCE_ARGS, "--synthetic-samples", "1024"]
    done = orchestrator(slurm_cluster, work, *launch_args(
        work, "restart", "--nodes", "2", "--max-restarts", "1", "--env=CRASH_ONCE_RANK=1",
        "--env=OMP_NUM_THREADS=1", *trainer, "--checkpoint-dir", "ckpt-restart"), timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    job_id = job_id_in(done.stdout)
    status = status_of(work, "restart")
    host = status["nodes"][1]["host"]
    assert f"rank 1 on {host} failed with exit code 3; torchrun restarts the workers " \
           "(--max-restarts 1 per node)" in out
    assert re.search(rf"restarted 1 time\(s\) \(--max-restarts 1\):\n.*restart 1: rank 1 on "
                     rf"{host} ended with exit code 3 after [\d.]+ s\n.*run restart succeeded",
                     out), out
    assert (status["state"], status["slurm_state"], status["restarts"]) == \
        ("succeeded", "COMPLETED", 1), status
    assert status["restart_causes"][0].startswith(f"restart 1: rank 1 on {host} ended with "
                                                  "exit code 3"), status
    assert [r["state"] for r in status["ranks"]] == ["succeeded"] * 2
    logs = work / "runs" / "restart" / "logs"
    rank1 = (logs / "rank-1.log").read_text()
    assert "rank 1 crashing once (attempt 0)" in rank1
    assert rank1.split("crashing once")[1].count("rank 1/2 started") == 1, rank1  # again
    rank0 = (logs / "rank-0.log").read_text()  # rank 0 reports the trainer's progress
    assert re.search(r"resumed from ckpt-restart/ckpt-\d+\.pt at step [1-9]", rank0), rank0
    assert_gone(slurm_cluster, job_id, "restart")

    plain = orchestrator(slurm_cluster, work, "launch", str(REPO / "hostfiles" / "local.txt"),
                         "--run-dir", str(work / "runs"), "--run-id", "plain",
                         "--env=OMP_NUM_THREADS=1", *trainer, "--checkpoint-dir", "ckpt-plain")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    difference = max_abs_difference(load_weights(work / "ckpt-restart" / "final.pt"),
                                    load_weights(work / "ckpt-plain" / "final.pt"))
    assert difference <= RESUME_TOLERANCE, difference
