"""The SLURM job, every value decided (`SlurmJob`), and what plan.yaml says of it. Pure.

orchestrator.slurm.batch.planning decides it; job.sbatch (orchestrator.slurm.batch.batch_script),
the submission and the following of the job only read it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from orchestrator.plan.deadline import Deadline
from orchestrator.plan.launch_plan import omp_threads, restarts_entry
from orchestrator.plan.spec import Program
from orchestrator.slurm.batch.containers import SlurmContainer

PORT_BASE, PORT_SPAN = 20000, 10000  # MASTER_PORT = PORT_BASE + job id % PORT_SPAN


@dataclass(frozen=True)
class SlurmJob:
    """The whole SLURM job, every value decided; rendering and the backend only read it."""

    run_id: str
    nnodes: int
    nproc: int
    nodelist: tuple[str, ...]  # from a hostfile; () lets SLURM choose
    python: str
    workdir: str
    program: Program
    env: tuple[tuple[str, str], ...]  # exported by the script (no secrets)
    secret_names: tuple[str, ...]
    master_addr: str | None  # None: the first node of the allocation
    master_port: int | None  # None: derived from the job id
    ifname: str | None  # None: each node picks the interface routing to MASTER_ADDR
    ifname_reason: str
    sbatch_lines: tuple[str, ...]  # after "#SBATCH "
    srun_args: tuple[str, ...]
    deadline: Deadline  # --time and the warning signal forwarded to the ranks
    requeue: bool
    job_dir: str | None  # ORCHESTRATOR_JOB_DIR: where nodes keep rank files (launch only)
    output: str | None  # the batch script's own output file (%j = job id)
    # --include/--exclude/--num-gpus: (node name, its CUDA_VISIBLE_DEVICES), set per node
    visible_devices: tuple[tuple[str, str], ...] = ()
    selection: str = ""  # the selection flags as given
    bind_cores: bool = False  # --bind-cores: core sets computed on each node at its start
    max_restarts: int = 0  # torchrun's --max-restarts; > 0 means c10d rendezvous
    spares: int = 0  # --spares: resubmissions after a node failure, each without that node
    spare_nodes: tuple[str, ...] = ()  # from a hostfile: the hosts held back, in order
    exclude: tuple[str, ...] = ()  # sbatch --exclude: failed and bad-listed nodes
    max_resubmits: int = 0  # submitted again after a time limit or a preemption
    container: SlurmContainer | None = None  # --container: torchrun and the ranks in an image
    # job_dir and output are folders on the nodes, not the run record's (which the nodes do
    # not see): the launcher hears every line through the agents (slurm/batch/node_files.py)
    node_side: bool = False
    # --min-nodes: after a node failure with no spare left, the job goes on (a next job) on
    # the survivors while at least this many remain; 0: every node is needed
    min_nodes: int = 0
    launch_nodes: int = 0  # the nodes the run was launched with (0: nnodes)
    # the --exclude of the launch (bad-listed nodes): those a shrink adds after are the lost
    # nodes growing back asks for; kept in the job so that an attached follower knows them
    launch_exclude: tuple[str, ...] = ()

    @property
    def signal_name(self) -> str | None:
        return self.deadline.signal_name

    @property
    def launched_nodes(self) -> int:
        """The nodes the run was launched with (a job after a shrink has fewer)."""
        return self.launch_nodes or self.nnodes

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc

    def on_nodes(
        self, nnodes: int, nodelist: tuple[str, ...], exclude: tuple[str, ...]
    ) -> SlurmJob:
        """The same job on other nodes: `nnodes` of them, a hostfile's `nodelist` (else
        SLURM chooses, `exclude` left out); its #SBATCH --nodes, --nodelist and --exclude
        lines rewritten to match."""
        lines = [line for line in self.sbatch_lines if not line.startswith("--exclude=")]
        lines = [f"--nodes={nnodes}" if line.startswith("--nodes=") else line for line in lines]
        if nodelist:
            lines = [
                f"--nodelist={','.join(nodelist)}" if line.startswith("--nodelist=") else line
                for line in lines
            ]
        elif exclude:
            at = next((i for i, line in enumerate(lines) if line.startswith("--output=")), None)
            lines.insert(len(lines) if at is None else at, f"--exclude={','.join(exclude)}")
        return replace(
            self, nnodes=nnodes, nodelist=nodelist, exclude=exclude, sbatch_lines=tuple(lines)
        )

    def node_of_rank(self, rank: int) -> int:
        return rank // self.nproc

    def port_of(self, job_id: int) -> int:
        """The rendezvous port of job `job_id`: --master-port, else the batch script's
        choice, PORT_BASE + the job id % PORT_SPAN."""
        return self.master_port or PORT_BASE + job_id % PORT_SPAN

    def to_dict(self) -> dict:
        """The job as plain data for plan.yaml (secret values never appear)."""
        return {
            "run_id": self.run_id,
            "backend": "slurm",
            "program": self.program.describe(),
            "nnodes": self.nnodes,
            "nproc_per_node": self.nproc,
            "world_size": self.world_size,
            "nodelist": list(self.nodelist) or "(chosen by SLURM)",
            "master_addr": self.master_addr or "(first node of the allocation)",
            "master_port": self.master_port or f"({PORT_BASE} + job id % {PORT_SPAN})",
            "ifname": f"{self.ifname or '(detected on each node)'}  # {self.ifname_reason}",
            "omp_num_threads": omp_threads(self.nproc, self.env),
            "python": self.python,
            "workdir": self.workdir,
            "sbatch": [f"#SBATCH {line}" for line in self.sbatch_lines],
            "secrets": list(self.secret_names),
            "env": dict(self.env),
            **(
                {"selection": self.selection, "cuda_visible_devices": dict(self.visible_devices)}
                if self.selection
                else {}
            ),
            **(
                {"cores": "(computed on each node at its start from its own topology)"}
                if self.bind_cores
                else {}
            ),
            **restarts_entry(self.max_restarts),
            **({"spares": self.spares_entry()} if self.spares else {}),
            **({"min_nodes": self.min_nodes_entry()} if self.min_nodes else {}),
            **({"exclude": list(self.exclude)} if self.exclude else {}),
            **({"deadline": self.deadline_entry()} if self.deadline.signal_name else {}),
            **(self.container.entry() if self.container else {}),
        }

    def deadline_entry(self) -> str:
        """What the time limit and its warning do for this job, in one line (plan.yaml)."""
        if self.requeue:
            then = "the script requeues the job (--requeue)"
        elif self.job_dir:
            then = f"`orchestrator launch` submits it again, up to {self.max_resubmits} time(s)"
        else:  # rendered, to submit by hand: nobody follows it
            then = "submit it again to resume (or render with --requeue)"
        return f"{self.deadline.describe()}; once they stopped on it {then}"

    def spares_entry(self) -> str:
        """What --spares does for this job, in one line (plan.yaml)."""
        whence = (
            f"the next of {', '.join(self.spare_nodes)} in its place"
            if self.spare_nodes
            else "a node SLURM chooses in its place"
        )
        return (
            f"{self.spares}: after a node failure (NODE_FAIL) the job is submitted again "
            f"without the failed node, {whence}, up to {self.spares} time(s)"
        )

    def min_nodes_entry(self) -> str:
        """What --min-nodes does for this job, in one line (plan.yaml, the script's header)."""
        spares = "with no spare left, " if self.spares else ""
        return (
            f"{self.min_nodes}: after a node failure (NODE_FAIL), {spares}the job is submitted "
            f"again on the nodes left, without the failed one(s), while at least "
            f"{self.min_nodes} of the {self.launched_nodes} launched remain"
        )
