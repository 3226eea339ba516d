"""Options shared by several commands (their defaults are the API's: `DEFAULTS`).

The commands themselves are in orchestrator.cli; the backend and SLURM options in
orchestrator.cli.backend_options; what the options make, in orchestrator.api.keywords.
"""

from __future__ import annotations

import functools

import click

from orchestrator.api.keywords import LaunchArgs
from orchestrator.api.shown import parse_size

DEFAULTS = LaunchArgs()  # every launch flag's default, as the Python API has it


def note(text: str) -> None:
    """A note for the user, on stderr: `[orchestrator] text`."""
    click.echo(f"[orchestrator] {text}", err=True)


def size_value(param: click.Parameter, value: str | int) -> int:
    if isinstance(value, int):
        return value
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param=param) from None


def job_options(func):
    """Options that describe the job itself; shared by launch and render."""
    options = [
        click.option(
            "--nproc-per-node",
            type=int,
            default=None,
            metavar="N",
            help="Ranks per node. Default: each host's slots (1 for a bare host).",
        ),
        click.option(
            "--master-addr",
            metavar="ADDR",
            help="Rendezvous address. Default: the first node (as reached by ssh; "
            "127.0.0.1 for a local job). Must be reachable from every node.",
        ),
        click.option(
            "--master-port",
            default=DEFAULTS.master_port,
            show_default=True,
            metavar="PORT|auto",
            help="Rendezvous port. 'auto': a free port that the master node's "
            "kernel picks (so runs sharing nodes never collide; 29500 when not "
            "probed, as by `render`). An explicit port is checked free first.",
        ),
        click.option(
            "--ifname",
            metavar="IFACE",
            help="Network interface for NCCL and gloo (NCCL_SOCKET_IFNAME, "
            "GLOO_SOCKET_IFNAME) on every node. Default: on each node, the one "
            "whose route reaches MASTER_ADDR. A hostfile ifname wins for its node.",
        ),
        click.option(
            "--env",
            "env",
            multiple=True,
            metavar="NAME=VALUE",
            help="Set a variable on every node (repeatable).",
        ),
        click.option(
            "--env-file",
            "env_files",
            multiple=True,
            metavar="FILE",
            type=click.Path(dir_okay=False),
            help="NAME=VALUE lines to set on every node (repeatable; --env wins); "
            "DeepSpeed's .deepspeed_env format. Without it, a .deepspeed_env in "
            "the home and current directories (or $DS_ENV_FILE) is used, as "
            "DeepSpeed does, and said so.",
        ),
        click.option(
            "--no-env-file",
            "no_env_file",
            is_flag=True,
            help="Do not read a .deepspeed_env found in the home or current directory.",
        ),
        click.option(
            "--secret-env",
            "secret_names",
            multiple=True,
            metavar="NAME",
            help="Treat NAME as a secret: its value is handed to the job at start, "
            "never written to scripts, plan or run record, and masked in logs. "
            "Names containing TOKEN, SECRET, PASSWORD, API_KEY, CREDENTIAL... "
            "are secrets already.",
        ),
        click.option(
            "--forward-env/--no-forward-env",
            default=DEFAULTS.forward_env,
            show_default=True,
            help="Forward this shell's NCCL_*, GLOO_*, TORCH_*, CUDA_*, PYTHON* and "
            "OMP_* variables to every node, except those naming this machine's "
            "own interfaces and GPUs (CUDA_VISIBLE_DEVICES: choose the nodes' "
            "with --include/--num-gpus or --env).",
        ),
        click.option(
            "--python",
            metavar="PATH",
            help="Interpreter (and its torchrun) on the nodes. Default: this "
            "orchestrator's own interpreter path, as on a shared file system. "
            "A hostfile python wins for its node.",
        ),
        click.option(
            "--workdir",
            metavar="DIR",
            help="Directory the ranks start in on every node. Default: the current directory.",
        ),
        click.option(
            "--max-restarts",
            "--max_restarts",
            "max_restarts",
            type=int,
            default=DEFAULTS.max_restarts,
            show_default=True,
            metavar="N",
            help="torchrun's --max-restarts: after a rank fails, torchrun restarts "
            "the workers on every node, up to N times per node (the job "
            "resumes from its own checkpoint); the run fails once torchrun "
            "gives up. N > 0 uses torchrun's c10d rendezvous.",
        ),
        click.option(
            "--bind-cores",
            "--bind_cores_to_rank",
            "bind_cores",
            is_flag=True,
            help="Pin each local rank to its own disjoint set of cores (and its NUMA "
            "node, with numactl) from the node's own topology, before the rank "
            "starts; the plan shows the sets. More local ranks than cores is "
            "refused. DeepSpeed's --bind_cores_to_rank.",
        ),
        *CONTAINER_OPTIONS,
    ]
    return functools.reduce(lambda f, option: option(f), reversed(options), func)


def container_options(func):
    """--container and its flags, for a command other than launch and render (check)."""
    return functools.reduce(lambda f, option: option(f), reversed(CONTAINER_OPTIONS), func)


CONTAINER_OPTIONS = [
    click.option(
        "--container",
        metavar="IMAGE",
        help="Run torchrun and the ranks inside this image (the agent stays on the host): "
        "docker/podman registry/name:tag, pyxis registry#name:tag, apptainer a .sif. "
        "The container shares the node's network and IPC; the working directory, the "
        "run's node folder and --sync copies are mounted at their own paths. A YAML "
        "hostfile's `container:` says the same; these flags win.",
    ),
    click.option(
        "--container-runtime",
        type=click.Choice(["auto", "docker", "podman", "apptainer", "pyxis"]),
        help="Over SSH: docker, podman or apptainer; under SLURM: pyxis or apptainer. "
        "Default auto: on each node docker (if its daemon answers), else podman, else "
        "apptainer (the preflight says which); under SLURM pyxis, or apptainer for a .sif.",
    ),
    click.option(
        "--container-mounts",
        metavar="SRC:DST[:ro],...",
        help="More host paths to mount (comma-separated), e.g. /data:/data:ro.",
    ),
    click.option(
        "--container-workdir",
        metavar="DIR",
        help="Where the ranks start inside the image. Default: the job's working directory.",
    ),
    click.option(
        "--container-arg",
        "container_args",
        multiple=True,
        metavar="ARG",
        help="A flag passed to the runtime as is (repeatable), e.g. --container-arg=--shm-size=8g.",
    ),
    click.option(
        "--container-python",
        metavar="PATH",
        help="The image's interpreter, with torch. Default: python3.",
    ),
]


def run_options(func):
    options = [
        click.option(
            "--run-id",
            metavar="NAME",
            help="Name of the run. Default: the time "
            "and a random suffix, e.g. 20261122-153012-a3f9.",
        ),
        click.option(
            "--run-dir",
            default=DEFAULTS.run_dir,
            show_default=True,
            metavar="DIR",
            help="Where run records are kept.",
        ),
    ]
    return functools.reduce(lambda f, option: option(f), reversed(options), func)


def ssh_options(func):
    """How to reach nodes over SSH; shared by launch, exec and check."""
    options = [
        click.option(
            "--ssh-config",
            metavar="FILE",
            help="OpenSSH client config to use "
            "instead of ~/.ssh/config and /etc/ssh/ssh_config, like ssh -F.",
        ),
        click.option(
            "-i",
            "--identity",
            "identity_files",
            multiple=True,
            metavar="FILE",
            help="Private key to try first (repeatable); the ssh-agent and "
            "~/.ssh/id_* are tried too.",
        ),
        click.option(
            "--known-hosts",
            metavar="FILE",
            help="Host keys to verify nodes "
            "against, instead of the ssh config's UserKnownHostsFile.",
        ),
        click.option(
            "--accept-new-host-keys",
            is_flag=True,
            help="Accept and record the host key of a node not yet in known_hosts "
            "(a changed key is still refused), like ssh's "
            "StrictHostKeyChecking=accept-new.",
        ),
        click.option(
            "--connect-timeout",
            type=click.FloatRange(min=0.1),
            metavar="SECONDS",
            help="Give up on a node that does not answer within this time "
            "[default: the ssh config's ConnectTimeout, else 10].",
        ),
    ]
    return functools.reduce(lambda f, option: option(f), reversed(options), func)


def run_dir_option(func):
    return click.option(
        "--run-dir",
        default=DEFAULTS.run_dir,
        show_default=True,
        metavar="DIR",
        help="Where run records are kept.",
    )(func)


def fold_option(func):
    return click.option(
        "--no-fold",
        "fold",
        is_flag=True,
        flag_value=False,
        default=DEFAULTS.fold,
        help="Show every line as printed. By default a line that several ranks or nodes "
        "print alike within a moment is shown once, prefixed with their host and rank "
        "lists ([ceon[1-64] r[0-63]] ...); the log files always hold every line.",
    )(func)


def footer_option(func):
    return click.option(
        "--no-footer",
        "footer",
        is_flag=True,
        flag_value=False,
        default=DEFAULTS.footer,
        help="No summary line under the stream. By default, on a terminal, one line under "
        "the ranks' output says how the run goes (ranks' states, step, samples/s, "
        "stragglers), as `orchestrator top` shows in full.",
    )(func)


def stragglers_option(func):
    default = "{:g},{:g}".format(*DEFAULTS.stragglers)  # written as the flag takes it

    def parse(ctx, param, value: str) -> tuple[float, float]:
        ratio, _, seconds = value.partition(",")
        try:
            rule = float(ratio), float(seconds)
        except ValueError:
            rule = (0.0, 0.0)
        if not (rule[0] > 1 and rule[1] > 0):
            raise click.BadParameter(
                f"{value!r}: give RATIO,SECONDS, a ratio above 1 and a positive window "
                f"(e.g. {default})",
                param=param,
            )
        return rule

    return click.option(
        "--stragglers",
        default=default,
        show_default=True,
        metavar="RATIO,SECONDS",
        callback=parse,
        help="Name a rank a straggler (once, on the console and in status.json) when its "
        "own step work, averaged over SECONDS, stays above RATIO times the other ranks' "
        "median. Its own work is what ranks report as work_s on the metrics channel (the "
        "bundled trainer does): step time alone names nobody, since every rank waits for "
        "the slowest.",
    )(func)
