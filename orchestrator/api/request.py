"""What a launch's options make: the cluster, the job's spec, the run's settings.

The options themselves, each checked once by the group that declares it, are
orchestrator/options/ (`LaunchArgs`: every `launch` flag under its keyword). `build` turns
them, with a hostfile and a program, into a `LaunchRequest`: the hosts chosen, the `JobSpec`
and the `LaunchOptions`, with the checks that join several groups or read files, whoever
launches (the command line or a Python program). Notes for the user (a bad-node list that
skipped hosts, an env file read) go to `say`. `time` and `signal` serve both backends: under
SLURM they go to the sbatch script; over SSH they make the run's `Deadline`, which the
controller keeps (supervise/time_limit.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace

from orchestrator.api.registry import backend_named
from orchestrator.errors import ConfigError
from orchestrator.hosts.hostfile import Cluster, load_hostfile
from orchestrator.hosts.selection import check_min_nodes, hold_spares, select_hosts
from orchestrator.options.backend_facts import BackendFacts
from orchestrator.options.choosing import Selection
from orchestrator.options.image import ContainerOptions
from orchestrator.options.keywords import LaunchArgs
from orchestrator.options.scheduler import SlurmOptions
from orchestrator.options.supervision import SWAP_AFTER_S
from orchestrator.options.workload import JobOptions
from orchestrator.plan.container import ContainerSpec, job_container
from orchestrator.plan.deadline import Deadline, plan_deadline
from orchestrator.plan.spec import (
    VISIBLE_DEVICES,
    JobSpec,
    Program,
    deepspeed_env_files,
    forwarded_env,
    load_env_file,
    merge_env,
    parse_env_assignments,
)
from orchestrator.record.bad_nodes import read_bad_nodes, skip_bad_nodes
from orchestrator.record.runs import check_run_id, new_run_id, refuse_existing
from orchestrator.start.settings import LaunchOptions, LaunchRequest

Say = Callable[[str], None]


def build(
    hostfile: str | None,
    program: Sequence[str],
    args: LaunchArgs,
    argv: Sequence[str],
    say: Say,
    *,
    new_run: bool = True,
) -> LaunchRequest:
    """Check every input and make the launch's parts. `new_run`: the run's folder must not
    exist yet (a launch; a render or a dry run writes none)."""
    run, hosts, slurm = args.run, args.hosts, args.slurm
    backend = backend_named(run.backend).facts
    if not backend.scheduled and slurm.login:
        raise ConfigError("--login applies to --backend slurm only")
    run_id = check_run_id(run.run_id) if run.run_id else new_run_id()
    if new_run:
        refuse_existing(run.run_dir, run_id)
    exclude: tuple[str, ...] = ()
    deadline = Deadline()  # under SLURM, --time and --signal go to the sbatch script
    if backend.scheduled:  # the SLURM group's request: its hosts are SLURM's to allocate
        cluster, exclude = slurm_nodes(hostfile, hosts, args.job.nproc_per_node, say)
    else:
        checked = check_backend(backend, slurm, hostfile)
        deadline = ssh_deadline(slurm.time, slurm.signal)
        cluster = select(checked, hosts, args.job.nproc_per_node, say)
        cluster = hold_spares(cluster, hosts.spares)
    check_min_nodes(hosts.min_nodes, *starting_nodes(cluster, hostfile, slurm, hosts.spares))
    swapping = args.supervision.swap_stragglers_after != SWAP_AFTER_S
    if swapping and not hosts.spares and hosts.min_nodes is None:
        raise ConfigError(
            "--swap-stragglers-after: a slow node is taken out only where the run can go on "
            "without it; add --spares N (hosts held back to take its place) or --min-nodes K"
        )
    spec = make_spec(program, args.job, gpus_chosen(hosts, cluster, backend), say)
    spec = replace(spec, container=container_of(cluster, args.container, backend.name))
    options = LaunchOptions(
        run_id=run_id,
        argv=tuple(argv),
        run=run,
        supervision=args.supervision,
        console=args.console,
        ssh=args.ssh,
        deadline=deadline,
        hosts=hosts,
    )
    return LaunchRequest(backend.name, cluster, spec, options, slurm, hosts.spares, exclude)


def starting_nodes(
    cluster: Cluster | None, hostfile: str | None, slurm: SlurmOptions, spares: int
) -> tuple[int | None, str]:
    """How many nodes a run starts on, and where that number comes from (for --min-nodes);
    None under SLURM without a hostfile or --nodes (refused later, for the missing --nodes)."""
    if cluster is None:
        return (None if slurm.nodes is None else int(slurm.nodes)), f"--nodes {slurm.nodes}"
    held = f", after --spares {spares}" if spares else ""
    return len(cluster.hosts), f"the hosts chosen from {hostfile}{held}"


def container_of(
    cluster: Cluster | None, options: ContainerOptions, backend: str
) -> ContainerSpec | None:
    """--container and its flags over the hostfile's `container:` (plan/container.py)."""
    return job_container(
        cluster.container if cluster is not None else None,
        cluster.container_source if cluster is not None else "",
        backend,
        options,
    )


def ssh_deadline(time: str | None, signal: str | None) -> Deadline:
    """--time and --signal over SSH: the limit the controller keeps and the warning it sends
    (plan/deadline.py). A warning needs a limit here: there is no partition's to go by."""
    deadline = plan_deadline(time, signal)
    if deadline.limit_s is None and deadline.signal_name is not None:
        raise ConfigError(
            f"--signal {signal} without --time: over SSH the warning comes ahead of the run's "
            "own time limit; give --time LIMIT as well (e.g. --time 4:00:00)"
        )
    return deadline


def check_backend(backend: BackendFacts, slurm: SlurmOptions, hostfile: str | None) -> Cluster:
    """For the SSH/local path: no SLURM-only option, and a hostfile; its Cluster."""
    slurm.refuse_for_ssh()
    if hostfile is None:
        raise ConfigError(
            "HOSTFILE is missing: give the hostfile before `--` (it may be left "
            "out only with --backend slurm)"
        )
    cluster = load_hostfile(hostfile)
    if backend.hosts_must_be_local and not cluster.is_local:
        first = next(h for h in cluster.hosts if not h.is_local)
        raise ConfigError(
            f"{first.source}: --backend {backend.name}, but {first.name} is not this "
            "machine; use --backend ssh (or auto)"
        )
    return cluster


def select(
    cluster: Cluster | None, selection: Selection, nproc_per_node: int | None, say: Say
) -> Cluster | None:
    """The hosts and slots the selection flags leave (the cluster itself without them)."""
    if cluster is None:
        if selection.given:
            raise ConfigError(
                f"{selection.describe().split()[0]} chooses hosts out of a "
                "hostfile: give HOSTFILE (with --backend slurm and no hostfile, "
                "use --nodes)"
            )
        return None
    cluster, skipped = skip_bad_nodes(cluster, selection.bad_nodes)
    if skipped:
        say(
            f"skipping {len(skipped)} host(s) on the bad-node list "
            f"{selection.bad_nodes}: {', '.join(skipped)}"
        )
    return select_hosts(cluster, selection, nproc_per_node)


def slurm_nodes(
    hostfile: str | None, selection: Selection, nproc_per_node: int | None, say: Say
) -> tuple[Cluster | None, tuple[str, ...]]:
    """--backend slurm: the hostfile's chosen hosts (its last `spares` held back), or,
    without one, the hosts of the bad-node list as --exclude."""
    if hostfile:
        cluster = select(load_hostfile(hostfile), selection, nproc_per_node, say)
        return hold_spares(cluster, selection.spares), ()
    select(None, selection, nproc_per_node, say)  # refuses a selection without a hostfile
    return None, tuple(read_bad_nodes(selection.bad_nodes)) if selection.bad_nodes else ()


def gpus_chosen(selection: Selection, cluster: Cluster | None, backend: BackendFacts) -> bool:
    """Whether the controller's CUDA_VISIBLE_DEVICES is moot for this job: a selection chose
    each node's GPUs, or (not under SLURM) every node is this machine, whose ranks inherit
    the controller's environment."""
    return selection.given or (not backend.scheduled and cluster is not None and cluster.is_local)


def env_file_layers(
    env_files: Sequence[str], no_env_file: bool, say: Say
) -> list[list[tuple[str, str]]]:
    """--env-file's pairs; without it, DeepSpeed's .deepspeed_env files (said, in one line)."""
    if not env_files and not no_env_file:
        env_files = deepspeed_env_files(os.getcwd(), os.path.expanduser("~"))
        if env_files:
            say(
                f"env file {', '.join(map(str, env_files))} (DeepSpeed's "
                ".deepspeed_env) sets variables on every node; --no-env-file "
                "ignores it"
            )
    return [load_env_file(path) for path in env_files]


def make_spec(program_argv: Sequence[str], job: JobOptions, gpus_chosen: bool, say: Say) -> JobSpec:
    """The JobSpec of the job's flags. `gpus_chosen` (see `gpus_chosen()`): nothing is said
    about the controller's CUDA_VISIBLE_DEVICES not being forwarded."""
    layers = [forwarded_env()] if job.forward_env else []
    layers += env_file_layers(job.env_files, job.no_env_file, say)
    layers.append(parse_env_assignments(job.env))
    here = os.environ.get(VISIBLE_DEVICES)
    if (
        job.forward_env
        and here is not None
        and not gpus_chosen
        and all(name != VISIBLE_DEVICES for layer in layers for name, _ in layer)
    ):
        say(
            f"{VISIBLE_DEVICES}={here} names this machine's GPUs and is not set on the "
            "nodes; choose theirs with --include/--exclude/--num-gpus, or set one value "
            f"for every node with --env {VISIBLE_DEVICES}=..."
        )
    return JobSpec(
        program=Program.from_argv(tuple(program_argv)),
        python=job.python or sys.executable,
        workdir=os.path.abspath(job.workdir) if job.workdir else os.getcwd(),
        nproc_per_node=job.nproc_per_node,
        master_addr=job.master_addr,
        master_port=job.master_port,
        ifname=job.ifname,
        env=merge_env(*layers),
        secret_names=frozenset(job.secret_names),
        sync_dir=os.path.abspath(job.sync_dir) if job.sync_dir else None,
        bind_cores=job.bind_cores,
        max_restarts=job.max_restarts,
    )
