"""The job group: what runs on every node and with what environment (launch, render; check
takes the first few)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.errors import ConfigError
from orchestrator.numerals import PORT, NumberError, whole_number
from orchestrator.options.declare import OptionGroup, option

AUTO = "auto"


def master_port(value: str | int) -> int | None:
    """`--master-port`: a number from 1 to 65535, or 'auto' (None: chosen at start)."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return None
    if isinstance(value, bool):
        raise ValueError("must be a number from 1 to 65535 or 'auto'")
    try:
        return whole_number(value, "it", *PORT)
    except NumberError:
        raise ValueError(f"must be a number from {PORT[0]} to {PORT[1]} or 'auto'") from None


@dataclass(frozen=True)
class JobOptions(OptionGroup):
    """The job's flags as given; plan/spec.py makes the `JobSpec` of them."""

    nproc_per_node: int | None = option(
        None,
        "Ranks per node. Default: each host's slots (1 for a bare host).",
        metavar="N",
        kind=int,
        minimum=1,
    )
    master_addr: str | None = option(
        None,
        "Rendezvous address. Default: the first node (as reached by ssh; 127.0.0.1 for a "
        "local job). Must be reachable from every node.",
        metavar="ADDR",
    )
    # None once read: 'auto' (29500 when not probed)
    master_port: int | str | None = option(
        AUTO,
        "Rendezvous port. 'auto': a free port that the master node's kernel picks (so runs "
        "sharing nodes never collide; 29500 when not probed, as by `render`). An explicit "
        "port is checked free first.",
        metavar="PORT|auto",
        parse=master_port,
    )
    ifname: str | None = option(
        None,
        "Network interface for NCCL and gloo (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME) on "
        "every node. Default: on each node, the one whose route reaches MASTER_ADDR. A "
        "hostfile ifname wins for its node.",
        metavar="IFACE",
        nonblank=True,
    )
    env: tuple[str, ...] = option(
        (), "Set a variable on every node (repeatable).", metavar="NAME=VALUE", repeat=True
    )
    env_files: tuple[str, ...] = option(
        (),
        "NAME=VALUE lines to set on every node (repeatable; --env wins); DeepSpeed's "
        ".deepspeed_env format. Without it, a .deepspeed_env in the home and current "
        "directories (or $DS_ENV_FILE) is used, as DeepSpeed does, and said so.",
        name="--env-file",
        metavar="FILE",
        repeat=True,
    )
    no_env_file: bool = option(
        False,
        "Do not read a .deepspeed_env found in the home or current directory.",
        switch="on",
    )
    secret_names: tuple[str, ...] = option(
        (),
        "Treat NAME as a secret: its value is handed to the job at start, never written to "
        "scripts, plan or run record, and masked in logs. Names containing TOKEN, SECRET, "
        "PASSWORD, API_KEY, CREDENTIAL... are secrets already.",
        name="--secret-env",
        metavar="NAME",
        repeat=True,
    )
    forward_env: bool = option(
        True,
        "Forward this shell's NCCL_*, GLOO_*, TORCH_*, CUDA_*, PYTHON* and OMP_* variables "
        "to every node, except those naming this machine's own interfaces and GPUs "
        "(CUDA_VISIBLE_DEVICES: choose the nodes' with --include/--num-gpus or --env).",
        switch="both",
    )
    python: str | None = option(
        None,
        "Interpreter (and its torchrun) on the nodes. Default: this orchestrator's own "
        "interpreter path, as on a shared file system. A hostfile python wins for its node.",
        metavar="PATH",
        nonblank=True,
    )
    workdir: str | None = option(
        None,
        "Directory the ranks start in on every node. Default: the current directory.",
        metavar="DIR",
        nonblank=True,
    )
    max_restarts: int = option(
        0,
        "torchrun's --max-restarts: after a rank fails, torchrun restarts the workers on "
        "every node, up to N times per node (the job resumes from its own checkpoint); the "
        "run fails once torchrun gives up. N > 0 uses torchrun's c10d rendezvous.",
        metavar="N",
        aliases=("--max_restarts",),
        kind=int,
        minimum=0,
    )
    bind_cores: bool = option(
        False,
        "Pin each local rank to its own disjoint set of cores (and its NUMA node, with "
        "numactl) from the node's own topology, before the rank starts; the plan shows the "
        "sets. More local ranks than cores is refused. DeepSpeed's --bind_cores_to_rank.",
        aliases=("--bind_cores_to_rank",),
        switch="on",
    )
    sync_dir: str | None = option(
        None,
        "Copy DIR into every node's run directory (over SFTP) before starting; the ranks "
        "start in the copy. Default: the script is expected at the same path on every node "
        "(shared file system).",
        name="--sync",
        metavar="DIR",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.env_files and self.no_env_file:
            raise ConfigError("--env-file and --no-env-file together: give one of them")
        if self.workdir is not None and self.sync_dir is not None:
            raise ConfigError("--workdir and --sync both say where ranks start; give one of them")
