"""Where a launched SLURM run's nodes keep their files: in the run record, or on the nodes.
Pure.

The nodes write each rank's output, metrics and exit and the node's own output, start and
end into the run's job folder (ORCHESTRATOR_JOB_DIR), and SLURM writes the batch script's
output (`#SBATCH --output`). Where the run record is on a file system the nodes share (the
default), both go into it (`nodes/`, `slurm-JOB.out`), and the launcher can read them.

Where it is not (a run folder in the launcher's /tmp, or a laptop's checkout with `--login`),
they go to a folder on the nodes (`--job-dir DIR`; with `--login`, /tmp where the login node
does not see the run folder): the job folder `DIR/orchestrator-RUN` on every node (each
node writes its own part), the batch output `DIR/slurm-JOB.out` on the batch node. Nothing
is lost to the record: every rank's line, metric and exit, every node's start, end and
samples and the time limit's warning come through the node agents (following/node_agents.py), which
the follower writes into the record as over SSH. The launcher then never reads those
folders (they are not its to see), and says where they are where it matters: a node whose
agent it never reached, and a job that failed before its nodes ran.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from orchestrator.slurm.batch.containers import slurm_container
from orchestrator.slurm.batch.job import SlurmJob

NODE_FOLDER = "/tmp"  # --login's default where the login node does not see the run folder


def in_record(record_path: Path) -> tuple[str, str]:
    """The job folder and the batch output in the run record (a shared file system)."""
    return str(record_path / "nodes"), str(record_path / "slurm-%j.out")


def on_the_nodes(job: SlurmJob, folder: str) -> SlurmJob:
    """The same job with its files in `folder` on the nodes instead of the run record."""
    base = folder.rstrip("/")
    job_dir, output = f"{base}/orchestrator-{job.run_id}", f"{base}/slurm-%j.out"
    lines = tuple(
        f"--output={output}" if line.startswith("--output=") else line for line in job.sbatch_lines
    )
    container = job.container
    if container is not None:  # the image mounts the job folder: this one now
        container = slurm_container(container.spec, job.workdir, job_dir)
    return replace(
        job,
        job_dir=job_dir,
        output=output,
        sbatch_lines=lines,
        container=container,
        node_side=True,
    )


def batch_output(job: SlurmJob, job_id: int) -> str:
    """Where SLURM writes the batch script's output of job `job_id`."""
    return (job.output or "slurm-%j.out").replace("%j", str(job_id))


def kept_on_node(job: SlurmJob, attempt: int) -> str | None:
    """The attempt's folder on the nodes, where the run record is not shared with them."""
    return f"{job.job_dir}/attempt{attempt}" if job.node_side else None


def kept_where(job: SlurmJob, job_id: int) -> str:
    """One line: where the nodes' files of a node-side job are (said at its submission)."""
    return (
        f"the run folder is not on a file system the nodes share: the nodes keep their "
        f"files in {job.job_dir} (each its own), the batch script's output is "
        f"{batch_output(job, job_id)} on the batch node; every line comes here through "
        "the node agents"
    )
