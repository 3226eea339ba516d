"""A SLURM run whose run record the nodes cannot see: on the lab's SLURM, the launcher runs in
a mount namespace of its own with a private tmpfs over its runs folder, so the nodes (and
the --login node, and slurmd) see an empty folder there. Two 2-node runs at once, each
rank printing numbered lines: one with `--job-dir` (the nodes keep their files in a folder
of their own), one over `--login`, whose login node does not see the run folder (the
launcher finds that, keeps the nodes' files in their /tmp, and gives sbatch the script on
its stdin). Both end `succeeded`, exit 0, with every line of every rank in the record's
per-rank logs and combined log, once and in order, and `stacks`, `status` and `logs` work;
no file of either record appears on the nodes' side, and the nodes' files are where the
launcher said."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab.slurm import SlurmCluster
from tests.slurm_helpers import (  # noqa: F401 (fixtures, used by name)
    assert_gone,
    command,
    job_id_in,
    launch_args,
    no_job_outlives_its_test,
    wait_for,
    work,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slurm]

COUNT = 200  # lines per rank, one every 5 ms; then each waits for RELEASE to exist
JOB = """\
import os, time
rank = int(os.environ["RANK"])
print(f"rank {rank} sees the run record: {os.path.exists(os.environ['RECORD'])}", flush=True)
for i in range(int(os.environ["COUNT"])):
    print(f"rank {rank} count {i}", flush=True)
    time.sleep(0.005)
while not os.path.exists(os.environ["RELEASE"]):
    time.sleep(0.05)
"""


@pytest.fixture
def private_runs(work: Path) -> Iterator[int]:
    """A process whose mount namespace has a tmpfs over work/runs that nobody else sees;
    its pid (nsenter -t PID -m runs a command there; /proc/PID/root reads its view)."""
    runs = work / "runs"
    runs.mkdir()
    holder = subprocess.Popen(
        [
            "unshare", "--mount", "--propagation", "private", "sh", "-c",
            f"mount -t tmpfs -o size=64m tmpfs {runs} && touch {runs}/probe && echo ready "
            "&& exec sleep 900",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()


def counts(text: str, rank: int) -> list[int]:
    return [int(i) for i in re.findall(rf"^.*rank {rank} count (\d+)$", text, re.MULTILINE)]


def test_a_run_record_the_nodes_do_not_see(
    slurm_cluster: SlurmCluster, work: Path, private_runs: int
) -> None:
    runs, login = work / "runs", slurm_cluster.nodes[-1].name
    (work / "noshare.py").write_text(JOB)
    (work / "on-nodes").mkdir()

    def seen(path: Path) -> Path:  # the launcher's view of a path
        return Path(f"/proc/{private_runs}/root{path}")

    def there(*args: str) -> subprocess.Popen[str]:  # an orchestrator command in that view
        return subprocess.Popen(
            ["nsenter", "-t", str(private_runs), "-m", f"--wd={work}", "--", *command(*args)],
            cwd=work,
            env=slurm_cluster.environ(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def ended(proc: subprocess.Popen[str], timeout: float = 60) -> str:
        try:
            out, _ = proc.communicate(timeout=timeout)
        finally:
            proc.kill()
        assert proc.returncode == 0, out
        return out

    # The nodes' view is this process's (the lab's nodes share its mounts): not the tmpfs.
    assert seen(runs / "probe").exists() and not (runs / "probe").exists()
    began = time.monotonic()
    where = {
        "noshare-dir": ["--job-dir", str(work / "on-nodes")],
        "noshare-login": ["--login", login],
    }
    launches = {
        run_id: there(
            *launch_args(work, run_id, "--nodes", "2", "--nproc-per-node", "1", *how),
            *("--env", f"COUNT={COUNT}", "--env", f"RECORD={runs / run_id}"),
            *("--env", f"RELEASE={work / 'release'}", "--", "noshare.py"),
        )
        for run_id, how in where.items()
    }  # both at once, in the foreground: each exits with its job

    def log(run_id: str, name: str = "combined.log") -> str:
        path = seen(runs / run_id / "logs" / name)
        return path.read_text(errors="replace") if path.exists() else ""

    def status(run_id: str) -> dict:
        return json.loads(seen(runs / run_id / "status.json").read_text())

    for run_id in launches:
        wait_for(lambda r=run_id: len(counts(log(r), 1)) == COUNT, 120, f"{run_id}'s lines")
    print(f"{time.monotonic() - began:.1f} s: every line")
    stacks = ended(there("stacks", "noshare-login", "--run-dir", str(runs)))
    assert "main thread in <module> (noshare.py:" in stacks, stacks
    print(f"{time.monotonic() - began:.1f} s: stacks")
    (work / "release").touch()
    jobs = {run_id: job_id_in(ended(launch, 120)) for run_id, launch in launches.items()}
    print(f"{time.monotonic() - began:.1f} s: ended")
    for run_id, job_id in jobs.items():
        done = status(run_id)
        assert (done["state"], done["exit_code"]) == ("succeeded", 0), done
        text = log(run_id)
        assert "the run folder is not on a file system the nodes share" in text, text
        assert "no way to its agent" not in text, text
        for rank in (0, 1):
            own = log(run_id, f"rank-{rank}.log")
            assert f"rank {rank} sees the run record: False" in own, own
            assert counts(own, rank) == list(range(COUNT)), f"{run_id}: rank {rank}'s log"
            assert counts(text, rank) == list(range(COUNT)), f"{run_id}: combined.log"
        assert_gone(slurm_cluster, job_id, run_id)
    asks = ("status", "logs")  # of the --login run, at once
    shown, logs = (there(what, "noshare-login", "--run-dir", str(runs)) for what in asks)
    assert "run noshare-login: succeeded" in ended(shown)
    assert f"rank 1 count {COUNT - 1}" in ended(logs)
    print(f"{time.monotonic() - began:.1f} s: status and logs")
    # Where the nodes kept their files: --job-dir's folder, and /tmp where --login found
    # the run folder out of the login node's sight (its script went to sbatch on stdin).
    node_side = {"noshare-dir": work / "on-nodes", "noshare-login": Path("/tmp")}
    try:
        for run_id, folder in node_side.items():
            rank_out = folder / f"orchestrator-{run_id}" / "attempt0" / "node1" / "rank-1.out"
            assert counts(rank_out.read_text(), 1) == list(range(COUNT)), rank_out
            assert (folder / f"slurm-{jobs[run_id]}.out").exists()
            assert status(run_id)["node_files"] == str(folder / f"orchestrator-{run_id}")
        script = seen(runs / "noshare-login" / "job.sbatch").read_text()
        assert "#SBATCH --output=/tmp/slurm-%j.out" in script
        assert list(runs.iterdir()) == [], "a file of a run record on the nodes' side"
    finally:
        shutil.rmtree("/tmp/orchestrator-noshare-login", ignore_errors=True)
        Path(f"/tmp/slurm-{jobs['noshare-login']}.out").unlink(missing_ok=True)
