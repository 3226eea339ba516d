"""`launch --backend slurm --min-nodes K`: a job that lost a node, with no spare left, is
followed by a job on the nodes left (orchestrator.attempts.next_attempt decides it; this is
how SLURM carries it out). Pure.

SLURM ends a job whose node fails (NODE_FAIL: the node set DOWN by an administrator, or
silent for SlurmdTimeout); the script asks `--no-requeue`, so SLURM does not requeue it on as
many nodes as before. The follower asks SLURM which of the job's nodes are down
(orchestrator.slurm.recovery.spares) and, when no spare is left to take their place and at least K
of the job's nodes are still up, submits the same job again on that many: `--nodes` the
survivors' count, the failed nodes in `--exclude` (a hostfile's node list without them).
The environment is the same, so ORCHESTRATOR_LAUNCH_WORLD_SIZE still names the world the run
was launched with while torchrun's WORLD_SIZE is the smaller one: the bundled trainer keeps
its global batch (more accumulation steps) and resumes from its checkpoint, as after a
time limit. Fewer than K left: the run ends `lost` (exit 1), naming the node and the floor.

Why a new job and not `--no-kill` with a new step on the survivors: SLURM ends the job on a
node failure unless it was submitted `--no-kill`, and with `--no-kill` the batch script,
which runs on the first node, still dies with that node; the step's end does not say which
node failed before SLURM has marked it DOWN, so the script would wait for the same
detection; and a new job gets a clean allocation (no step credential or port of the dead
step left behind), works the same for a script submitted by hand (`sbatch --nodes=N-1
--exclude=NODE job.sbatch`), and is the path --spares and the time limit already take.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from orchestrator.slurm.batch.job import SlurmJob


def shrunk(job: SlurmJob, failed: Sequence[str], job_dir: str | None) -> SlurmJob:
    """The same job on its nodes but `failed` (each one of the job's): one node fewer for
    each, a hostfile's node list without them, else `failed` in --exclude (with the nodes
    excluded before); the same command and environment."""
    lost = list(dict.fromkeys(failed))
    nodelist = tuple(name for name in job.nodelist if name not in lost)
    exclude = (*job.exclude, *(name for name in lost if name not in job.exclude))
    smaller = job.on_nodes(job.nnodes - len(lost), nodelist, exclude)
    return replace(smaller, job_dir=job_dir)
