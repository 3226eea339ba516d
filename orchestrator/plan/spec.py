"""The job spec: what to run and how, made of the job's flags (orchestrator/options/
workload.py, where each flag is checked) once the environment is read; one frozen value.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import ConfigError, SourceError
from orchestrator.plan.container import ContainerSpec

DEFAULT_MASTER_PORT = 29500
BUNDLED_TRAINER = "orchestrator.trainer"
DEEPSPEED_ENV_NAME = ".deepspeed_env"  # DeepSpeed's env file: NAME=VALUE lines for every node

# Controller variables forwarded to every node unless --no-forward-env: the knobs users
# set for NCCL, gloo, torch, CUDA, Python and OpenMP.
FORWARDED_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "CUDA_", "PYTHON", "OMP_")
# The GPUs a process may use, by index on its own machine: the controller's value names the
# controller's GPUs (often a SLURM allocation's), so each node keeps its own, or gets the
# ids a selection chose there (--include/--exclude/--num-gpus), or an --env value.
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
# Set per node by the plan or meaningful only on the controller: never forwarded.
NOT_FORWARDED = frozenset(
    {
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        VISIBLE_DEVICES,
        "PYTHONHOME",
        "PYTHONEXECUTABLE",
        "PYTHONSTARTUP",
        "PYTHONINSPECT",
        "PYTHONBREAKPOINT",
    }
)
# A variable whose name matches is a secret: never rendered into a script, plan or log.
SECRET_NAME = re.compile(
    r"(SECRET|TOKEN|PASSWORD|PASSWD|PASSPHRASE|API_?KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL)",
    re.IGNORECASE,
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Set by the orchestrator itself; a user may not override them through --env.
RESERVED_ENV = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "NODE_RANK",
        "GROUP_RANK",
        "LOCAL_WORLD_SIZE",
    }
)
# Read-only in bash: `export UID=5` would end the node script.
BASH_READONLY = frozenset(
    {
        "UID",
        "EUID",
        "PPID",
        "SHELLOPTS",
        "BASHOPTS",
        "BASH_VERSINFO",
        "BASHPID",
        "GROUPS",
    }
)


@dataclass(frozen=True)
class Program:
    """What each rank runs: a script path or a module (`-m`), with its arguments."""

    target: str
    args: tuple[str, ...] = ()
    is_module: bool = False

    @classmethod
    def from_argv(cls, argv: Iterable[str]) -> Program:
        """`[]` -> the bundled trainer; `['-m', 'pkg.mod', ...]` -> a module; else a script."""
        argv = list(argv)
        if not argv:
            return cls(target=BUNDLED_TRAINER, is_module=True)
        if argv[0] == "-m":
            if len(argv) < 2:
                raise ConfigError("'-m' needs a module name, e.g. -- -m mypkg.train --lr 0.1")
            return cls(target=argv[1], args=tuple(argv[2:]), is_module=True)
        if argv[0].startswith("-"):
            raise ConfigError(
                f"after '--' comes the script to run, got option {argv[0]!r}; "
                "put orchestrator options before '--'"
            )
        return cls(target=argv[0], args=tuple(argv[1:]))

    @property
    def is_bundled_trainer(self) -> bool:
        return self.is_module and self.target == BUNDLED_TRAINER

    def argv(self) -> tuple[str, ...]:
        """The rank's argv after the interpreter: `-m mod args` or `script args`."""
        head = ("-m", self.target) if self.is_module else (self.target,)
        return head + self.args

    def describe(self) -> str:
        return (
            "bundled trainer (python -m orchestrator.trainer)"
            if self.is_bundled_trainer
            else shlex.join(self.argv())
        )


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A job as the user asked for it, before any host is looked at."""

    program: Program
    python: str  # interpreter on every node (and its torchrun), unless the hostfile says
    workdir: str  # where ranks start on every node
    nproc_per_node: int | None = None
    master_addr: str | None = None
    master_port: int | None = None  # None: auto (29500 when free, else a free one)
    ifname: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    secret_names: frozenset[str] = field(default_factory=frozenset)
    sync_dir: str | None = None  # copied to every node; the ranks start in the copy
    bind_cores: bool = (
        False  # --bind-cores: each local rank on its own cores (orchestrator.agent.programs.cores)
    )
    max_restarts: int = 0  # torchrun's --max-restarts: worker-group restarts per node
    container: ContainerSpec | None = None  # --container: torchrun and the ranks in an image

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    def is_secret(self, name: str) -> bool:
        return name in self.secret_names or bool(SECRET_NAME.search(name))


def parse_env_assignments(items: Iterable[str], flag: str = "--env") -> list[tuple[str, str]]:
    """`--env K=V` (repeatable). `--env K` alone is an error that says how to write it."""
    pairs = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(
                f"{flag} {item!r}: expected NAME=VALUE, e.g. {flag} {name or 'NAME'}=1"
            )
        pairs.append((_check_env_name(name, f"{flag} {item!r}"), value))
    return pairs


def load_env_file(path: str | Path) -> list[tuple[str, str]]:
    """`--env-file`: NAME=VALUE lines; `#` comments, blank lines, `export ` and quotes allowed."""
    shown = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise SourceError(shown, None, "env file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(shown, None, f"cannot read env file: {exc}") from None
    pairs = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        name, sep, value = line.partition("=")
        if not sep:
            raise SourceError(shown, lineno, f"expected NAME=VALUE, got {line!r}")
        name = name.strip()
        problem = env_name_problem(name)
        if problem:
            raise SourceError(shown, lineno, problem)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        pairs.append((name, value))
    return pairs


def deepspeed_env_files(
    cwd: str | Path, home: str | Path, environ: Mapping[str, str] | None = None
) -> list[Path]:
    """DeepSpeed's `.deepspeed_env` files, as its launcher finds them: in home, then in cwd.

    The name is `$DS_ENV_FILE` when set, as for DeepSpeed; the cwd's file is read last, so
    its values win. One file when cwd is home.
    """
    environ = os.environ if environ is None else environ
    name = environ.get("DS_ENV_FILE") or DEEPSPEED_ENV_NAME
    found: list[Path] = []
    for folder in (Path(home), Path(cwd)):
        path = folder / name
        if path.is_file() and all(not path.samefile(p) for p in found):
            found.append(path)
    return found


def forwarded_env(environ: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """The controller's NCCL_*/GLOO_*/TORCH_*/CUDA_*/PYTHON*/OMP_* variables, sorted."""
    environ = os.environ if environ is None else environ
    return sorted(
        (k, v)
        for k, v in environ.items()
        if k.startswith(FORWARDED_PREFIXES) and k not in NOT_FORWARDED and _ENV_NAME.fullmatch(k)
    )


MIN_INHERITED_SECRET = 8  # shorter values of secret-named variables are settings, not secrets


def inherited_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of this machine's secret-named variables (HF_TOKEN, WANDB_API_KEY, ...),
    which a job on this machine inherits with the rest of the environment: they are masked
    in its output like --env secrets. A value under MIN_INHERITED_SECRET characters is left
    alone: TOKENIZERS_PARALLELISM=false names a token but holds none."""
    environ = os.environ if environ is None else environ
    return sorted(
        value
        for name, value in environ.items()
        if SECRET_NAME.search(name) and len(value) >= MIN_INHERITED_SECRET
    )


def merge_env(*layers: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Later layers win; order of first appearance is kept so scripts read naturally."""
    merged: dict[str, str] = {}
    for layer in layers:
        for name, value in layer:
            merged[name] = value
    return tuple(merged.items())


def env_name_problem(name: str) -> str | None:
    """Why `name` cannot be set on the nodes, or None."""
    if not _ENV_NAME.fullmatch(name):
        return f"{name!r} is not a valid variable name"
    if name in RESERVED_ENV:
        return (
            f"{name} is set by the orchestrator for each node; use the matching flag "
            "(--master-addr, --master-port, ...) instead"
        )
    if name in BASH_READONLY:
        return f"{name} is read-only in the node scripts' shell and cannot be set"
    return None


def _check_env_name(name: str, where: str) -> str:
    problem = env_name_problem(name)
    if problem:
        raise ConfigError(f"{where}: {problem}")
    return name
