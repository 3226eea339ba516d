"""Planning the SLURM job: a spec, the SLURM options and an optional hostfile -> `SlurmJob`,
every value decided. Pure.

A hostfile names the nodes (its spares, held back by --spares, the nodes that replace a
failed one) and may give their slots, python and interface, the same on every node;
without one SLURM chooses --nodes N of them. The options become job.sbatch's `#SBATCH`
lines; the time limit (--time, or an --sbatch-arg that gives it) decides when the warning
signal goes out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.errors import ConfigError
from orchestrator.hosts.hostfile import Cluster
from orchestrator.options.scheduler import SlurmOptions
from orchestrator.plan.deadline import DEFAULT_RESUBMITS, Deadline, plan_deadline
from orchestrator.plan.launch_plan import IFNAME_VARS, LAUNCH_WORLD_SIZE, launch_world_env
from orchestrator.plan.spec import VISIBLE_DEVICES, JobSpec
from orchestrator.slurm.batch.containers import container_fields
from orchestrator.slurm.batch.job import SlurmJob

_TIME_ARG = re.compile(r"^(?:--time=|-t=?)(.+)$")


@dataclass(frozen=True)
class _Nodes:
    """What the job runs on: a hostfile's hosts, or --nodes N that SLURM chooses."""

    nodelist: tuple[str, ...]  # () lets SLURM choose
    nnodes: int
    nproc: int
    python: str | None  # the hostfile's, the same on every host
    ifname: str | None  # the hostfile's, the same on every host
    visible_devices: tuple[tuple[str, str], ...]  # (node name, its CUDA_VISIBLE_DEVICES)


@dataclass(frozen=True)
class _Exports:
    """What the script exports (no secret), the secrets' names, and the interface."""

    env: tuple[tuple[str, str], ...]
    secret_names: tuple[str, ...]
    ifname: str | None  # None: each node picks the interface routing to MASTER_ADDR
    ifname_reason: str


def plan_slurm_job(
    spec: JobSpec,
    options: SlurmOptions,
    run_id: str,
    cluster: Cluster | None = None,
    job_dir: str | None = None,
    output: str | None = None,
    spares: int = 0,
    exclude: tuple[str, ...] = (),
    min_nodes: int | None = None,
) -> SlurmJob:
    """Decide every value of the job; `cluster` (a hostfile) becomes the node list, its
    spares (held back by --spares) the nodes that replace a failed one; `min_nodes`
    (--min-nodes) how few nodes the job may go on with after a node failure."""
    _refuse_conflicts(spec, options, spares)
    nodes = _nodes(spec, options, cluster)
    _check_min_nodes(min_nodes, options.requeue)
    exports = _exports(spec, run_id, nodes, from_hostfile=cluster is not None)
    deadline = plan_deadline(_time_of(options), options.signal)
    # After a node failure the launcher submits the next job (--spares, --min-nodes).
    resubmits_on_failure = bool(spares or min_nodes)
    lines, srun_args = _sbatch_lines(
        options,
        run_id,
        nodes,
        deadline,
        output=output,
        no_requeue=resubmits_on_failure,
        exclude=exclude,
    )
    return SlurmJob(
        run_id=run_id,
        nnodes=nodes.nnodes,
        nproc=nodes.nproc,
        nodelist=nodes.nodelist,
        **container_fields(spec.container, nodes.python or spec.python, spec.workdir, job_dir),
        workdir=spec.workdir,
        program=spec.program,
        env=exports.env,
        secret_names=exports.secret_names,
        master_addr=spec.master_addr,
        master_port=spec.master_port,
        ifname=exports.ifname,
        ifname_reason=exports.ifname_reason,
        sbatch_lines=lines,
        srun_args=srun_args,
        deadline=deadline,
        requeue=options.requeue,
        job_dir=job_dir,
        output=output,
        visible_devices=nodes.visible_devices,
        selection=cluster.selection if cluster else "",
        bind_cores=spec.bind_cores,
        max_restarts=spec.max_restarts,
        spares=spares,
        spare_nodes=tuple(h.name for h in cluster.spares) if cluster else (),
        exclude=tuple(exclude) if not nodes.nodelist else (),
        max_resubmits=_max_resubmits(options),
        min_nodes=min_nodes or 0,
        launch_nodes=nodes.nnodes,
        launch_exclude=tuple(exclude) if not nodes.nodelist else (),
    )


def _refuse_conflicts(spec: JobSpec, options: SlurmOptions, spares: int) -> None:
    """The combinations a SLURM job cannot have (each option was checked by its group)."""
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


def _check_min_nodes(min_nodes: int | None, requeue: bool) -> None:
    """--min-nodes K (at most the nodes the run starts on: api/request.py) is not for
    --requeue, with which SLURM requeues the job on as many nodes as before."""
    if min_nodes is not None and requeue:
        raise ConfigError(
            "--min-nodes and --requeue: with --requeue SLURM requeues the job itself after a "
            "node failure, on as many nodes as before; with --min-nodes the launcher submits "
            "it again on the nodes left; give one of them"
        )


def _nodes(spec: JobSpec, options: SlurmOptions, cluster: Cluster | None) -> _Nodes:
    """The nodes, and the ranks on each, from a hostfile or from --nodes."""
    if cluster is None:
        if options.nodes is None:
            raise ConfigError("--backend slurm needs --nodes N (or a HOSTFILE naming the nodes)")
        nproc = spec.nproc_per_node or options.gpus_per_node or 1
        return _Nodes((), int(options.nodes), nproc, None, None, ())
    nodelist = tuple(h.name for h in cluster.hosts)
    if options.nodes is not None and options.nodes != len(nodelist):
        raise ConfigError(
            f"--nodes {options.nodes} but {cluster.path} lists "
            f"{len(nodelist)} host(s); give one or the other"
        )
    slots = None
    if cluster.selection:
        slots = _uniform_selection(cluster)
    elif spec.nproc_per_node is None:
        slots = _uniform(cluster, "slots", "--nproc-per-node")
    python = _uniform(cluster, "python", "--python")
    ifname = None
    if spec.ifname is None or len({h.ifname for h in cluster.hosts}) == 1:
        ifname = _uniform(cluster, "ifname", "--ifname")  # as over SSH, the hostfile wins
    nproc = (
        slots if cluster.selection else spec.nproc_per_node or slots or options.gpus_per_node or 1
    )
    visible_devices = tuple(
        (h.name, ",".join(map(str, h.slot_ids))) for h in cluster.hosts if h.slot_ids is not None
    )
    return _Nodes(nodelist, len(nodelist), nproc, python, ifname, visible_devices)


def _exports(spec: JobSpec, run_id: str, nodes: _Nodes, from_hostfile: bool) -> _Exports:
    """The job's environment without its secrets (the script never holds one), with the
    interface for NCCL and gloo where one is known."""
    secret_names = tuple(sorted(name for name, _ in spec.env if spec.is_secret(name)))
    own = {LAUNCH_WORLD_SIZE, *secret_names} | (
        {VISIBLE_DEVICES} if nodes.visible_devices else set()
    )
    env = [(k, v) for k, v in spec.env if k not in own]
    ifname = nodes.ifname or spec.ifname
    reason = "hostfile" if from_hostfile and ifname and not spec.ifname else "--ifname"
    if ifname:
        env += [(var, ifname) for var in IFNAME_VARS if var not in spec.env_dict]
    else:
        reason = "each node picks the interface whose route reaches MASTER_ADDR"
    launch_world = launch_world_env([nodes.nproc] * nodes.nnodes)
    env += [("ORCHESTRATOR_RUN_ID", run_id), launch_world, ("PYTHONUNBUFFERED", "1")]
    return _Exports(tuple(env), secret_names, ifname, reason)


def _sbatch_lines(
    options: SlurmOptions,
    run_id: str,
    nodes: _Nodes,
    deadline: Deadline,
    *,
    output: str | None,
    no_requeue: bool,
    exclude: tuple[str, ...],
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The `#SBATCH` lines (without `#SBATCH `), then what srun is given again of them."""
    lines = [
        f"--job-name={options.job_name or run_id}",
        f"--nodes={nodes.nnodes}",
        "--ntasks-per-node=1",
    ]
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
    if nodes.nodelist:
        lines.append(f"--nodelist={','.join(nodes.nodelist)}")
    elif exclude:
        lines.append(f"--exclude={','.join(exclude)}")
    if output:
        lines.append(f"--output={output}")
    if deadline.signal_name:
        lines.append(f"--signal=B:{deadline.signal_name}@{deadline.warning_s}")
    if options.requeue:
        lines.append("--requeue")
    if options.requeue or output:  # a requeued job's output goes on in the same file
        lines.append("--open-mode=append")
    if no_requeue:
        lines.append("--no-requeue")  # a node failure ends the job; the launcher resubmits
    lines += options.sbatch_args
    for line in lines:
        if not line.isprintable():
            raise ConfigError(f"#SBATCH {line!r}: a value contains a control character")
    return tuple(lines), tuple(srun_args)


def _max_resubmits(options: SlurmOptions) -> int:
    """How often `launch` submits the job again after a time limit or a preemption."""
    if options.max_resubmits is not None:
        return options.max_resubmits
    return 0 if options.requeue else DEFAULT_RESUBMITS  # with --requeue the script requeues


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


def _time_of(options: SlurmOptions) -> str | None:
    """The job's time limit: --time, or the last --sbatch-arg=--time=... (sbatch's own
    rule: the later option wins, and --sbatch-arg lines come after --time)."""
    found = options.time
    for arg in options.sbatch_args:
        match = _TIME_ARG.match(arg)
        if match:
            found = match.group(1)
    return found
