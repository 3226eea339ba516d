"""The SLURM flags of `launch` and `render` (`SlurmOptions`), each checked when the job is
planned (orchestrator.slurm.planning), which turns them into job.sbatch's `#SBATCH` lines
(orchestrator.slurm.batch_script).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields

from orchestrator.errors import ConfigError

_NAME_LIST = re.compile(r"^[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*$")
_JOB_NAME = re.compile(r"^[A-Za-z0-9_.+:@%=-]{1,200}$")


@dataclass(frozen=True, kw_only=True)
class SlurmOptions:
    """What the SLURM flags of `launch`/`render` asked for (None: not given)."""

    nodes: int | None = None
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    job_name: str | None = None
    gpus_per_node: int | None = None
    cpus_per_node: int | None = None
    sbatch_args: tuple[str, ...] = ()
    signal: str | None = None  # "USR1@60": SIGUSR1 60 s before the time limit
    requeue: bool = False
    max_resubmits: int | None = None  # None: DEFAULT_RESUBMITS
    login: str | None = None  # submit and query over SSH on this login node

    def given_flags(self) -> list[str]:
        """The flags that were given (to say that they apply to --backend slurm only)."""
        flag = {"sbatch_args": "sbatch-arg"}
        return [
            f"--{flag.get(f.name, f.name.replace('_', '-'))}"
            for f in fields(self)
            if getattr(self, f.name) not in (None, (), False)
        ]


def _check(options: SlurmOptions) -> None:
    checks = [
        ("--nodes", options.nodes, lambda v: v >= 1, "a positive number of nodes"),
        ("--gpus-per-node", options.gpus_per_node, lambda v: v >= 1, "a positive number"),
        ("--cpus-per-node", options.cpus_per_node, lambda v: v >= 1, "a positive number"),
        (
            "--partition",
            options.partition,
            _NAME_LIST.match,
            "a partition name (or a comma-separated list)",
        ),
        ("--account", options.account, _NAME_LIST.match, "an account name"),
        (
            "--job-name",
            options.job_name,
            _JOB_NAME.match,
            "a name of letters, digits and _.+:@%=- (no spaces)",
        ),
    ]
    for flag, value, ok, what in checks:
        if value is not None and not ok(value):
            raise ConfigError(f"{flag} {value!r}: expected {what}")
    for arg in options.sbatch_args:
        if not arg.startswith("-") or not arg.isprintable():
            raise ConfigError(
                f"--sbatch-arg {arg!r}: expected one sbatch option on one line, "
                "e.g. --sbatch-arg=--mem=8G or --sbatch-arg=--constraint=a100"
            )
