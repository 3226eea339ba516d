"""The SLURM group: what the job asks of SLURM (launch, render with --backend slurm).
`--time` and `--signal` serve both backends: over SSH the controller keeps the limit."""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.errors import ConfigError
from orchestrator.numerals import NumberError, whole_number
from orchestrator.options.declare import OptionGroup, flag_name, option

BOTH_BACKENDS = ("time", "signal")  # the fields an SSH launch takes too
_NAME_LIST = re.compile(r"^[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*$")
_JOB_NAME = re.compile(r"^[A-Za-z0-9_.+:@%=-]{1,200}$")


def time_limit_alias(text: str) -> str:
    """--time-limit's value, for --time: SLURM's forms, except a bare number. The name reads
    as seconds (as every *-timeout flag here and exec's --timeout take), SLURM's forms make
    it minutes: refused, with the two ways to write what was meant."""
    if not isinstance(text, str):
        raise ValueError("expected a time limit as text, e.g. '4:00:00'")
    try:
        number = whole_number(text, "it")
    except NumberError:
        return text  # not a bare number: --time reads it (a bare one of 19 digits too)
    if number > 0:
        seconds = f"{number // 60}:{number % 60:02d}"
        raise ValueError(
            "a bare number is ambiguous here (seconds, or SLURM's minutes?); write "
            f"--time {seconds} for {number} s or --time {number} for {number} "
            "minutes (SLURM's forms)"
        )
    return text


def name_list(text: str) -> str:
    if not _NAME_LIST.match(text):
        raise ValueError("expected a name (or a comma-separated list)")
    return text


def job_name(text: str) -> str:
    if not _JOB_NAME.match(text):
        raise ValueError("expected a name of letters, digits and _.+:@%=- (no spaces)")
    return text


def node_folder(text: str) -> str:
    """--job-dir: an absolute path, one word (it goes into an #SBATCH line)."""
    if not text.startswith("/") or not text.isprintable() or any(c.isspace() for c in text):
        raise ValueError("expected an absolute folder on the nodes without spaces, e.g. /tmp")
    return text.rstrip("/") or "/"


def sbatch_arg(text: str) -> str:
    if not text.startswith("-") or not text.isprintable():
        raise ValueError(
            "expected one sbatch option on one line, e.g. --sbatch-arg=--mem=8G or "
            "--sbatch-arg=--constraint=a100"
        )
    return text


@dataclass(frozen=True, kw_only=True)
class SlurmOptions(OptionGroup):
    """What the SLURM flags of `launch`/`render` asked for (None: not given)."""

    nodes: int | None = option(
        None,
        "[slurm] Number of nodes, when no HOSTFILE names them.",
        metavar="N",
        kind=int,
        minimum=1,
    )
    partition: str | None = option(
        None, "[slurm] Partition to run in.", metavar="NAME", parse=name_list
    )
    time: str | None = option(
        None,
        "Time limit of the run (SLURM's forms: MINUTES, MINUTES:SECONDS, HH:MM:SS, "
        "DAYS-HH[:MM[:SS]]). The ranks get SIGUSR1 ahead of it (see --signal); over SSH the "
        "run is stopped at the limit (exit 124); under SLURM a job that reaches it is "
        "submitted again (see --max-resubmits).",
        metavar="LIMIT",
    )
    time_limit: str | None = option(
        None,
        "--time, except a bare number (seconds or minutes?), which is refused.",
        metavar="LIMIT",
        parse=time_limit_alias,
    )  # read into `time`, then None
    account: str | None = option(
        None, "[slurm] Account to charge.", metavar="NAME", parse=name_list
    )
    job_name: str | None = option(
        None, "[slurm] Job name. Default: the run id.", metavar="NAME", parse=job_name
    )
    gpus_per_node: int | None = option(
        None,
        "[slurm] GPUs per node (also the default --nproc-per-node).",
        metavar="N",
        kind=int,
        minimum=1,
    )
    cpus_per_node: int | None = option(
        None, "[slurm] CPUs per node (the node's one task).", metavar="N", kind=int, minimum=1
    )
    sbatch_args: tuple[str, ...] = option(
        (),
        "[slurm] Any other sbatch option, written as an #SBATCH line after the others "
        "(repeatable), e.g. --sbatch-arg=--mem=64G.",
        name="--sbatch-arg",
        metavar="OPTION",
        repeat=True,
        parse=sbatch_arg,
    )
    signal: str | None = option(
        None,
        "Send SIG (USR1 or USR2) to every rank that many seconds before the time limit (the "
        "bundled trainer saves a checkpoint and exits), e.g. USR1@300; none: no warning. "
        "Default with --time: USR1 120 s before it (a quarter of a limit under 8 minutes).",
        metavar="SIG@SECONDS",
    )  # "USR1@60": SIGUSR1 60 s before the time limit
    requeue: bool = option(
        False,
        "[slurm] Let SLURM requeue the job; with --signal, the script requeues it once the "
        "ranks stopped on the signal, so it resumes (trainer: --checkpoint-dir DIR --resume).",
        switch="on",
    )
    max_resubmits: int | None = option(
        None,
        "[slurm] After the job ends by its time limit (or stops on the warning) or is "
        "preempted, submit it again, same run and command, up to N times; the program "
        "resumes from its checkpoint (trainer: --checkpoint-dir DIR --resume). A job "
        "cancelled by scancel or `orchestrator stop` is never resubmitted. [default: 10]",
        metavar="N",
        kind=int,
        minimum=0,
    )  # None: plan/deadline.py's DEFAULT_RESUBMITS
    login: str | None = option(
        None,
        "[slurm] Run sbatch/squeue/scancel on this login node over SSH. Where it does not "
        "see --run-dir (not on a file system the cluster shares, at the same path), the "
        "nodes keep their files in /tmp (see --job-dir).",
        metavar="HOST",
    )  # submit and query over SSH on this login node
    job_dir: str | None = option(
        None,
        "[slurm] A folder on the nodes (existing on each, e.g. /tmp or a node-local scratch) "
        "where they keep their files (each rank's output and exit, the batch script's "
        "output) when --run-dir is not on a file system they share: every line still comes "
        "into the run record through the node agents. Default: the run record itself; with "
        "--login, /tmp where the login node does not see --run-dir.",
        metavar="DIR",
        parse=node_folder,
    )  # None: the run record's nodes/ (shared), or --login's check decides

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.time_limit is not None:
            if self.time is not None:
                raise ConfigError("give --time or --time-limit, not both")
            object.__setattr__(self, "time", self.time_limit)
            object.__setattr__(self, "time_limit", None)

    def refuse_for_ssh(self) -> None:
        """Over SSH: no SLURM-only flag may be given (--time and --signal serve both)."""
        both = {flag_name(self, keyword) for keyword in BOTH_BACKENDS}
        given = [flag for flag in self.given() if flag not in both]
        if given:
            raise ConfigError(f"{given[0]} applies to --backend slurm only")
