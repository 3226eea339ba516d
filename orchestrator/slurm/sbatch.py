"""The SLURM job: spec + SLURM options (+ an optional hostfile) -> `SlurmJob` -> job.sbatch. Pure.

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
exits 128+10. `orchestrator launch` then submits the job again (orchestrator.slurm.segments)
and the trainer resumes from the newest checkpoint in DIR. With `--requeue` the script
instead runs `scontrol requeue` itself (for a script submitted by hand). A rank of your
own does the same with a SIGUSR1 handler and its own checkpoints; a rank without a
handler ignores the signal.

Spares (`--spares N`): the job asks for its nodes only, with `--no-requeue` so that a node
failure ends it (NODE_FAIL) instead of SLURM requeueing it in place; `launch` then submits
it again without the failed node (orchestrator.slurm.spares), up to N times. With a
hostfile the last N hosts are the spares, taken in order; without one, SLURM chooses the
replacement from the partition, the failed nodes (and the --bad-nodes list) in --exclude.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.errors import ConfigError
from orchestrator.hosts.hostfile import Cluster
from orchestrator.options.scheduler import SlurmOptions
from orchestrator.plan.deadline import DEFAULT_RESUBMITS, Deadline, plan_deadline
from orchestrator.plan.launch_plan import IFNAME_VARS, omp_threads, restarts_entry
from orchestrator.plan.scripts import render_template
from orchestrator.plan.spec import VISIBLE_DEVICES, JobSpec, Program
from orchestrator.slurm.containers import SlurmContainer, container_fields

SCRIPT_NAME = "job.sbatch"
PORT_BASE, PORT_SPAN = 20000, 10000  # MASTER_PORT = PORT_BASE + job id % PORT_SPAN
_TIME_ARG = re.compile(r"^(?:--time=|-t=?)(.+)$")


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

    @property
    def signal_name(self) -> str | None:
        return self.deadline.signal_name

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc

    def node_of_rank(self, rank: int) -> int:
        return rank // self.nproc

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


def _uniform(cluster: Cluster, attribute: str, flag: str) -> str | int | None:
    """A hostfile field that must be the same on every host of a SLURM job."""
    first = getattr(cluster.hosts[0], attribute)
    for host in cluster.hosts[1:]:
        if getattr(host, attribute) != first:
            raise ConfigError(
                f"{host.source}: {attribute}={getattr(host, attribute)} differs "
                f"from the first host's ({first}); a SLURM job has the same "
                f"{attribute} on every node (pass {flag} instead)"
            )
    return first


def _uniform_selection(cluster: Cluster) -> int:
    """The ranks per node a selection left, the same on every node of a SLURM job."""
    first = cluster.hosts[0]
    for host in cluster.hosts[1:]:
        if host.slots != first.slots:
            raise ConfigError(
                f"{cluster.selection}: leaves {host.slots} slot(s) on {host.name} "
                f"but {first.slots} on {first.name}; a SLURM job runs the same "
                "number of ranks on every node, so choose as many on each"
            )
    return int(first.slots or 1)


def plan_slurm_job(
    spec: JobSpec,
    options: SlurmOptions,
    run_id: str,
    cluster: Cluster | None = None,
    job_dir: str | None = None,
    output: str | None = None,
    spares: int = 0,
    exclude: tuple[str, ...] = (),
) -> SlurmJob:
    """Decide every value of the job; `cluster` (a hostfile) becomes the node list, its
    spares (held back by --spares) the nodes that replace a failed one."""
    if spares and options.requeue:
        raise ConfigError(
            "--spares and --requeue: with --requeue SLURM requeues the job itself after a "
            "node failure, with --spares the launcher submits it again without the failed "
            "node; give one of them"
        )
    if options.requeue and options.max_resubmits is not None:
        raise ConfigError(
            "--requeue and --max-resubmits: with --requeue the script requeues the job "
            "itself (the same job id), with --max-resubmits `orchestrator launch` submits "
            "it again; give one of them"
        )
    if spec.sync_dir is not None:
        raise ConfigError(
            "--sync does not apply to --backend slurm: SLURM nodes share a file "
            "system; keep the code there and give --workdir"
        )
    nodelist: tuple[str, ...] = ()
    slots = python = ifname = None
    if cluster is not None:
        nodelist = tuple(h.name for h in cluster.hosts)
        if options.nodes is not None and options.nodes != len(nodelist):
            raise ConfigError(
                f"--nodes {options.nodes} but {cluster.path} lists "
                f"{len(nodelist)} host(s); give one or the other"
            )
        if cluster.selection:
            slots = _uniform_selection(cluster)
        elif spec.nproc_per_node is None:
            slots = _uniform(cluster, "slots", "--nproc-per-node")
        python = _uniform(cluster, "python", "--python")
        if spec.ifname is None or len({h.ifname for h in cluster.hosts}) == 1:
            ifname = _uniform(cluster, "ifname", "--ifname")  # as over SSH, the hostfile wins
    elif options.nodes is None:
        raise ConfigError("--backend slurm needs --nodes N (or a HOSTFILE naming the nodes)")
    nnodes = len(nodelist) or int(options.nodes or 1)
    nproc = (
        slots
        if cluster is not None and cluster.selection
        else spec.nproc_per_node or slots or options.gpus_per_node or 1
    )
    visible_devices = tuple(
        (h.name, ",".join(map(str, h.slot_ids)))
        for h in (cluster.hosts if cluster else ())
        if h.slot_ids is not None
    )

    secret_names = tuple(sorted(name for name, _ in spec.env if spec.is_secret(name)))
    own = set(secret_names) | ({VISIBLE_DEVICES} if visible_devices else set())
    env = [(k, v) for k, v in spec.env if k not in own]
    ifname = ifname or spec.ifname
    reason = "hostfile" if cluster is not None and ifname and not spec.ifname else "--ifname"
    if ifname:
        env += [(var, ifname) for var in IFNAME_VARS if var not in spec.env_dict]
    else:
        reason = "each node picks the interface whose route reaches MASTER_ADDR"
    env += [("ORCHESTRATOR_RUN_ID", run_id), ("PYTHONUNBUFFERED", "1")]

    lines = [f"--job-name={options.job_name or run_id}", f"--nodes={nnodes}", "--ntasks-per-node=1"]
    srun_args = []
    if options.cpus_per_node:
        lines.append(f"--cpus-per-task={options.cpus_per_node}")
        srun_args.append(f"--cpus-per-task={options.cpus_per_node}")  # srun does not inherit it
    if options.gpus_per_node:
        lines.append(f"--gpus-per-node={options.gpus_per_node}")
        srun_args.append(f"--gpus-per-node={options.gpus_per_node}")
    for flag, value in (
        ("partition", options.partition),
        ("time", options.time),
        ("account", options.account),
    ):
        if value:
            lines.append(f"--{flag}={value}")
    if nodelist:
        lines.append(f"--nodelist={','.join(nodelist)}")
    elif exclude:
        lines.append(f"--exclude={','.join(exclude)}")
    if output:
        lines.append(f"--output={output}")
    deadline = plan_deadline(_time_of(options), options.signal)
    resubmits = options.max_resubmits
    if resubmits is None:  # with --requeue the script requeues; nothing is resubmitted
        resubmits = 0 if options.requeue else DEFAULT_RESUBMITS
    if deadline.signal_name:
        lines.append(f"--signal=B:{deadline.signal_name}@{deadline.warning_s}")
    if options.requeue:
        lines.append("--requeue")
    if options.requeue or output:  # a requeued job's output goes on in the same file
        lines.append("--open-mode=append")
    if spares:
        lines.append("--no-requeue")  # a node failure ends the job; the launcher resubmits
    lines += options.sbatch_args
    for line in lines:
        if not line.isprintable():
            raise ConfigError(f"#SBATCH {line!r}: a value contains a control character")
    return SlurmJob(
        run_id=run_id,
        nnodes=nnodes,
        nproc=nproc,
        nodelist=nodelist,
        **container_fields(spec.container, python or spec.python, spec.workdir, job_dir),
        workdir=spec.workdir,
        program=spec.program,
        env=tuple(env),
        secret_names=secret_names,
        master_addr=spec.master_addr,
        master_port=spec.master_port,
        ifname=ifname,
        ifname_reason=reason,
        sbatch_lines=tuple(lines),
        srun_args=tuple(srun_args),
        deadline=deadline,
        requeue=options.requeue,
        job_dir=job_dir,
        output=output,
        visible_devices=visible_devices,
        selection=cluster.selection if cluster else "",
        bind_cores=spec.bind_cores,
        max_restarts=spec.max_restarts,
        spares=spares,
        spare_nodes=tuple(h.name for h in cluster.spares) if cluster else (),
        exclude=tuple(exclude) if not nodelist else (),
        max_resubmits=resubmits,
    )


def _time_of(options: SlurmOptions) -> str | None:
    """The job's time limit: --time, or the last --sbatch-arg=--time=... (sbatch's own
    rule: the later option wins, and --sbatch-arg lines come after --time)."""
    found = options.time
    for arg in options.sbatch_args:
        match = _TIME_ARG.match(arg)
        if match:
            found = match.group(1)
    return found


def render_sbatch(job: SlurmJob, command: str) -> str:
    """The sbatch script of the job, runnable by hand with `sbatch job.sbatch`."""
    return render_template(
        "slurm.sbatch.j2",
        job=job,
        command=command,
        script_name=SCRIPT_NAME,
        port_base=PORT_BASE,
        port_span=PORT_SPAN,
    )
