"""job.sbatch: the SLURM job (`SlurmJob`) as the one script that runs it. Pure.

One sbatch script runs the whole job: `#SBATCH` lines ask for N nodes with one task each;
the body takes MASTER_ADDR from the allocation, a MASTER_PORT from the job id, and starts
torchrun on every node with `srun --kill-on-bad-exit=1`, node rank SLURM_NODEID. Each rank
runs through the same `run_rank` wrapper as the SSH node script (templates/_run_rank.sh.j2).

Under `orchestrator launch`, ORCHESTRATOR_JOB_DIR (a folder of the run record, on a file
system the nodes share) is written into the script: every node then keeps its ranks'
output and exit codes in `attempt<restart>/node<SLURM_NODEID>/` there, which the launcher
follows. Without it (`render`, then `sbatch job.sbatch` by hand) the ranks' output goes to
the usual slurm-<jobid>.out.

Time limits and preemption (`--time 4:00:00`, orchestrator.plan.deadline): SLURM sends
SIGUSR1 to the batch script 120 s before the limit (`#SBATCH --signal=B:USR1@120`, or
`--signal`; with preemption on, at once when the job is preempted); the script writes
`attempt<restart>/warning` in the job folder and passes the signal through srun to every
process of the step, where torchrun and the wrappers ignore it and the ranks handle it:
the bundled trainer, run with `--checkpoint-dir DIR --resume`, saves a checkpoint and
exits 128+10. `orchestrator launch` then submits the job again, the run's next attempt
(orchestrator.slurm.recovery.job_attempts), and the trainer resumes from the newest
checkpoint in DIR.
With `--requeue` the script instead runs `scontrol requeue` itself (for a script submitted by hand).
A rank of your own does the same with a SIGUSR1 handler and its own checkpoints; a rank without a
handler ignores the signal.

Spares (`--spares N`): the job asks for its nodes only, with `--no-requeue` so that a node
failure ends it (NODE_FAIL) instead of SLURM requeueing it in place; `launch` then submits
it again without the failed node (orchestrator.slurm.recovery.spares), up to N times. With a
hostfile the last N hosts are the spares, taken in order; without one, SLURM chooses the
replacement from the partition, the failed nodes (and the --bad-nodes list) in --exclude.
"""

from __future__ import annotations

import base64
import gzip

from orchestrator.agent.bootstrap import BOOTSTRAP, slurm_bundle, stack_hook_source
from orchestrator.agent.protocol import GRACE_S
from orchestrator.agent.relay import socket_path
from orchestrator.agent.task_warning import stopped_file
from orchestrator.plan.scripts import render_template
from orchestrator.slurm.batch.job import PORT_BASE, PORT_SPAN, SlurmJob

SCRIPT_NAME = "job.sbatch"
CODE_LINE = 76  # base64 characters per line of the agent's code in the script


def render_sbatch(job: SlurmJob, command: str) -> str:
    """The sbatch script of the job, runnable by hand with `sbatch job.sbatch`."""
    return render_template(
        "slurm.sbatch.j2",
        job=job,
        command=command,
        script_name=SCRIPT_NAME,
        port_base=PORT_BASE,
        port_span=PORT_SPAN,
        agent_boot=BOOTSTRAP,
        agent_code=agent_code(job),
        agent_python=agent_python(job),
        node_part=node_part(job),
        # node 0's keeper's code after the warning (task_warning.stopped_on_warning): shell words
        # for "$..." in the script, node 0 being the batch script's own node
        stopped_file=stopped_file(
            socket_path("$SLURM_JOB_ID", "${SLURM_RESTART_COUNT:-0}", 0, "$UID")
        ),
        apptainer=in_apptainer(job),
    )


def in_apptainer(job: SlurmJob) -> bool:
    """Whether the job runs in an apptainer image (started by the script itself, inside
    srun's task; pyxis is srun's own flags)."""
    return job.container is not None and job.container.spec.runtime == "apptainer"


def node_part(job: SlurmJob) -> str:
    """The shell function that runs a node's part (torchrun), which the agent starts."""
    return "orchestrator_apptainer" if in_apptainer(job) else "orchestrator_node"


def agent_python(job: SlurmJob) -> str:
    """The interpreter the node agent runs with: the job's, except where the job's is inside
    an apptainer image, whose agent runs outside it (the node's python3)."""
    return "python3" if in_apptainer(job) else job.python


def dial_python(job: SlurmJob) -> str:
    """The interpreter of the launcher's dial to a node's agent (programs/dial.py, standard
    library only): outside any image (a step of its own, which pyxis does not put in the
    job's image), so the node's python3 where the job has one; else the job's."""
    return "python3" if job.container is not None else job.python


def agent_code(job: SlurmJob) -> str:
    """The node agent (its modules and its config), gzipped, in base64 lines."""
    config = {
        "run_id": job.run_id,
        "argv": ["bash", "-c", node_part(job)],
        # Each node's agent ships its ranks' output, metrics and exits to the launcher,
        # as over SSH (a node's ranks: keeper.node_config).
        "nproc": job.nproc,
        "grace": GRACE_S,
        "stack_hook": stack_hook_source(),
    }
    text = base64.b64encode(gzip.compress(slurm_bundle(config), mtime=0)).decode()
    return "\n".join(text[i : i + CODE_LINE] for i in range(0, len(text), CODE_LINE))
