"""A launch's keywords, and what they make: the cluster, the job's spec, the run's options.

`LaunchArgs` holds every `launch` flag under its keyword (the flag's name with `_` for `-`;
`env=("K=V", ...)`, `sbatch_args=(...)` for the repeatable ones), with the command line's
defaults (tests/unit/test_api_keywords.py holds the two to each other). `build` turns them,
with a hostfile and a program, into a `LaunchRequest`: the hosts chosen, the `JobSpec`, the
`LaunchOptions` (and the SLURM options), every check of the input done once, here, whoever
launches (the command line or a Python program). Notes for the user (a bad-node list that
skipped hosts, an env file read) go to `say`. `time` and `signal` serve both backends: under
SLURM they go to the sbatch script; over SSH they make the run's `Deadline`, which the
controller keeps (supervise/time_limit.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace

from orchestrator.backends.base import SshOptions
from orchestrator.errors import ConfigError
from orchestrator.hosts.hostfile import Cluster, load_hostfile
from orchestrator.hosts.selection import Selection, hold_spares, select_hosts
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
    parse_master_port,
)
from orchestrator.record.bad_nodes import read_bad_nodes, skip_bad_nodes
from orchestrator.record.runs import check_run_id, new_run_id, refuse_existing
from orchestrator.sizes import parse_size
from orchestrator.slurm.sbatch import SlurmOptions
from orchestrator.start.settings import LaunchOptions
from orchestrator.supervise.hangs import DEFAULT_HANG_TIMEOUT_S
from orchestrator.supervise.stragglers import RATIO, WINDOW_S

Say = Callable[[str], None]
BACKENDS = ("auto", "local", "ssh", "slurm")
SSH_KEYS = (
    "ssh_config", "identity_files", "known_hosts", "accept_new_host_keys", "connect_timeout",
)  # fmt: skip
SELECTION_KEYS = ("include", "exclude", "num_nodes", "num_gpus", "bad_nodes")
SLURM_KEYS = tuple(f.name for f in fields(SlurmOptions) if f.name != "login")
BOTH_BACKENDS = ("--time", "--signal")  # SlurmOptions' flags that SSH launches take too


@dataclass(frozen=True)
class LaunchArgs:
    """Every launch flag, by keyword, with the command line's default."""

    # the job (orchestrator/cli/options.py job_options)
    nproc_per_node: int | None = None
    master_addr: str | None = None
    master_port: str = "auto"
    ifname: str | None = None
    env: tuple[str, ...] = ()
    env_files: tuple[str, ...] = ()
    no_env_file: bool = False
    secret_names: tuple[str, ...] = ()
    forward_env: bool = True
    python: str | None = None
    workdir: str | None = None
    max_restarts: int = 0
    bind_cores: bool = False
    sync_dir: str | None = None
    container: str | None = None
    container_runtime: str | None = None
    container_mounts: str | None = None
    container_workdir: str | None = None
    container_args: tuple[str, ...] = ()
    container_python: str | None = None
    # which hosts
    include: str | None = None
    exclude: str | None = None
    num_nodes: int | None = None
    num_gpus: int | None = None
    bad_nodes: str | None = None
    spares: int = 0
    # where it runs
    backend: str = "auto"
    nodes: int | None = None
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    job_name: str | None = None
    gpus_per_node: int | None = None
    cpus_per_node: int | None = None
    sbatch_args: tuple[str, ...] = ()
    signal: str | None = None
    requeue: bool = False
    max_resubmits: int | None = None
    login: str | None = None
    # the run
    run_id: str | None = None
    run_dir: str = "runs"
    preflight: bool = True
    grace: float = 10.0
    heartbeat_timeout: float = 30.0
    stall_timeout: float = 600.0
    hang_timeout: float = DEFAULT_HANG_TIMEOUT_S
    min_free_disk: int | str = "1G"
    keep_node_logs: bool = False
    color: str = "auto"
    fold: bool = True
    footer: bool = True
    stragglers: tuple[float, float] = (RATIO, WINDOW_S)
    # ssh
    ssh_config: str | None = None
    identity_files: tuple[str, ...] = ()
    known_hosts: str | None = None
    accept_new_host_keys: bool = False
    connect_timeout: float | None = None

    @classmethod
    def of(cls, keywords: dict) -> LaunchArgs:
        """From keywords, refusing one that is no launch flag (with the ones that are)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(keywords) - known)
        if unknown:
            raise ConfigError(
                f"launch: no keyword {unknown[0]!r}; the keywords are launch's flags: "
                + ", ".join(sorted(known))
            )
        lists = ("env", "env_files", "secret_names", "sbatch_args", "identity_files")
        lists += ("container_args",)
        values = {k: tuple(v) if k in lists and v is not None else v for k, v in keywords.items()}
        return cls(**values)

    def take(self, keys: Sequence[str]) -> dict:
        values = asdict(self)
        return {key: values[key] for key in keys}


@dataclass(frozen=True)
class LaunchRequest:
    """A launch, checked and ready to start: what `launch` needs, whoever asked."""

    backend: str  # "slurm", or "ssh" for every SSH and local launch
    cluster: Cluster | None  # None: SLURM without a hostfile
    spec: JobSpec
    options: LaunchOptions
    slurm: SlurmOptions
    spares: int = 0
    exclude: tuple[str, ...] = ()  # SLURM: hosts held back from the allocation


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
    if args.backend not in BACKENDS:
        raise ConfigError(f"backend {args.backend!r}: choose one of {', '.join(BACKENDS)}")
    slurm = SlurmOptions(**args.take((*SLURM_KEYS, "login")))
    if args.backend != "slurm" and args.login:
        raise ConfigError("--login applies to --backend slurm only")
    selection = Selection(**args.take(SELECTION_KEYS))
    run_id = check_run_id(args.run_id) if args.run_id else new_run_id()
    if new_run:
        refuse_existing(args.run_dir, run_id)
    exclude: tuple[str, ...] = ()
    deadline = Deadline()  # under SLURM, --time and --signal go to the sbatch script
    if args.backend == "slurm":
        cluster, exclude = slurm_nodes(hostfile, selection, args, say)
    else:
        checked = check_backend(args.backend, slurm, hostfile)
        deadline = ssh_deadline(args.time, args.signal)
        cluster = select(checked, selection, args.nproc_per_node, say)
        cluster = hold_spares(cluster, args.spares)
    spec = make_spec(program, args, gpus_chosen(selection, cluster, args.backend), say)
    spec = replace(spec, container=container_of(cluster, args))
    options = LaunchOptions(
        run_dir=args.run_dir,
        run_id=run_id,
        argv=tuple(argv),
        grace=args.grace,
        heartbeat_timeout=args.heartbeat_timeout,
        stall_timeout=args.stall_timeout,
        hang_timeout=args.hang_timeout,
        min_free_disk=min_free_disk(args.min_free_disk),
        keep_node_logs=args.keep_node_logs,
        bad_nodes=selection.bad_nodes,
        color=args.color,
        fold=args.fold,
        footer=args.footer,
        stragglers=args.stragglers,
        preflight=args.preflight,
        ssh=ssh_options(args),
        deadline=deadline,
    )
    backend = "slurm" if args.backend == "slurm" else "ssh"
    return LaunchRequest(backend, cluster, spec, options, slurm, args.spares, exclude)


def container_of(cluster: Cluster | None, args: LaunchArgs) -> ContainerSpec | None:
    """--container and its flags over the hostfile's `container:` (plan/container.py)."""
    return job_container(
        cluster.container if cluster is not None else None,
        cluster.container_source if cluster is not None else "",
        "slurm" if args.backend == "slurm" else "ssh",
        image=args.container,
        runtime=args.container_runtime,
        mounts=args.container_mounts,
        workdir=args.container_workdir,
        args=args.container_args,
        python=args.container_python,
    )


def min_free_disk(value: int | str) -> int:
    if isinstance(value, int):
        return value
    try:
        return parse_size(value)
    except ValueError as exc:
        raise ConfigError(f"--min-free-disk {value!r}: {exc}") from None


def ssh_options(args: LaunchArgs) -> SshOptions:
    return make_ssh_options(**args.take(SSH_KEYS))


def ssh_keywords(command: str, keywords: dict) -> SshOptions:
    """The ssh flags, by keyword, of a command other than launch (exec, check, clean)."""
    unknown = sorted(set(keywords) - set(SSH_KEYS))
    if unknown:
        raise ConfigError(
            f"{command}: no keyword {unknown[0]!r}; the ssh keywords are {', '.join(SSH_KEYS)}"
        )
    return make_ssh_options(**{**LaunchArgs().take(SSH_KEYS), **keywords})


def make_ssh_options(
    ssh_config, identity_files, known_hosts, accept_new_host_keys, connect_timeout
) -> SshOptions:
    return SshOptions(
        config_path=ssh_config,
        known_hosts=known_hosts,
        accept_new_host_keys=accept_new_host_keys,
        connect_timeout=connect_timeout,
        identity_files=tuple(identity_files),
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


def check_backend(backend: str, slurm: SlurmOptions, hostfile: str | None) -> Cluster:
    """For the SSH/local path: no SLURM-only option, and a hostfile; its Cluster."""
    given = [flag for flag in slurm.given_flags() if flag not in BOTH_BACKENDS]
    if given:
        raise ConfigError(f"{given[0]} applies to --backend slurm only")
    if hostfile is None:
        raise ConfigError(
            "HOSTFILE is missing: give the hostfile before `--` (it may be left "
            "out only with --backend slurm)"
        )
    cluster = load_hostfile(hostfile)
    if backend == "local" and not cluster.is_local:
        first = next(h for h in cluster.hosts if not h.is_local)
        raise ConfigError(
            f"{first.source}: --backend local, but {first.name} is not this "
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


def slurm_nodes(hostfile: str | None, selection: Selection, args: LaunchArgs, say: Say):
    """--backend slurm: the hostfile's chosen hosts (its last `spares` held back), or,
    without one, the hosts of the bad-node list as --exclude."""
    if hostfile:
        cluster = select(load_hostfile(hostfile), selection, args.nproc_per_node, say)
        return hold_spares(cluster, args.spares), ()
    select(None, selection, args.nproc_per_node, say)  # refuses a selection without a hostfile
    return None, tuple(read_bad_nodes(selection.bad_nodes)) if selection.bad_nodes else ()


def refuse_empty(**flags: str | None) -> None:
    """Refuse a flag given as '' (or blanks) instead of silently taking it as not given.

    Keyword names are the flags' (`python=...` checks --python).
    """
    for name, value in flags.items():
        if value is not None and not value.strip():
            raise ConfigError(f"--{name.replace('_', '-')} must not be empty")


def gpus_chosen(selection: Selection, cluster: Cluster | None, backend: str) -> bool:
    """Whether the controller's CUDA_VISIBLE_DEVICES is moot for this job: a selection chose
    each node's GPUs, or (not under SLURM) every node is this machine, whose ranks inherit
    the controller's environment."""
    return selection.given or (backend != "slurm" and cluster is not None and cluster.is_local)


def env_file_layers(env_files, no_env_file: bool, say: Say) -> list[list[tuple[str, str]]]:
    """--env-file's pairs; without it, DeepSpeed's .deepspeed_env files (said, in one line)."""
    if env_files and no_env_file:
        raise ConfigError("--env-file and --no-env-file together: give one of them")
    if not env_files and not no_env_file:
        env_files = deepspeed_env_files(os.getcwd(), os.path.expanduser("~"))
        if env_files:
            say(
                f"env file {', '.join(map(str, env_files))} (DeepSpeed's "
                ".deepspeed_env) sets variables on every node; --no-env-file "
                "ignores it"
            )
    return [load_env_file(path) for path in env_files]


def make_spec(
    program_argv: Sequence[str], args: LaunchArgs, gpus_chosen: bool, say: Say
) -> JobSpec:
    """The JobSpec of the flags. `gpus_chosen` (see `gpus_chosen()`): nothing is said about
    the controller's CUDA_VISIBLE_DEVICES not being forwarded."""
    refuse_empty(ifname=args.ifname, python=args.python, workdir=args.workdir)
    layers = [forwarded_env()] if args.forward_env else []
    layers += env_file_layers(args.env_files, args.no_env_file, say)
    layers.append(parse_env_assignments(args.env))
    here = os.environ.get(VISIBLE_DEVICES)
    if (
        args.forward_env
        and here is not None
        and not gpus_chosen
        and all(name != VISIBLE_DEVICES for layer in layers for name, _ in layer)
    ):
        say(
            f"{VISIBLE_DEVICES}={here} names this machine's GPUs and is not set on the "
            "nodes; choose theirs with --include/--exclude/--num-gpus, or set one value "
            f"for every node with --env {VISIBLE_DEVICES}=..."
        )
    if args.workdir is not None and args.sync_dir is not None:
        raise ConfigError("--workdir and --sync both say where ranks start; give one of them")
    return JobSpec(
        program=Program.from_argv(tuple(program_argv)),
        python=args.python or sys.executable,
        workdir=os.path.abspath(args.workdir) if args.workdir else os.getcwd(),
        nproc_per_node=args.nproc_per_node,
        master_addr=args.master_addr,
        master_port=parse_master_port(args.master_port),
        ifname=args.ifname,
        env=merge_env(*layers),
        secret_names=frozenset(args.secret_names),
        sync_dir=os.path.abspath(args.sync_dir) if args.sync_dir else None,
        bind_cores=args.bind_cores,
        max_restarts=args.max_restarts,
    )
