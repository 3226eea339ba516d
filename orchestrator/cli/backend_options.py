"""Command-line options for choosing the backend, and the SLURM job's options.

Shared by `launch` and `render` (orchestrator.cli); what they make, and whether they fit
the chosen backend, is orchestrator.api.keywords'.
"""

from __future__ import annotations

import functools

import click

from orchestrator.cli.options import DEFAULTS


def backend_options(func):
    """--backend and the SLURM job's options; shared by launch and render."""
    options = [
        click.option(
            "--backend",
            type=click.Choice(["auto", "local", "ssh", "slurm"]),
            default=DEFAULTS.backend,
            show_default=True,
            help="auto or ssh: SSH to the hosts (localhost entries run directly); "
            "local: every host must be this machine; slurm: one sbatch job "
            "(HOSTFILE optional, then --nodes; MASTER_PORT from the job id "
            "unless --master-port).",
        ),
        click.option(
            "--nodes",
            type=int,
            default=None,
            metavar="N",
            help="[slurm] Number of nodes, when no HOSTFILE names them.",
        ),
        click.option("--partition", metavar="NAME", help="[slurm] Partition to run in."),
        click.option(
            "--time",
            "--time-limit",
            "time",
            metavar="LIMIT",
            help="Time limit of the run (SLURM's forms: MINUTES, MINUTES:SECONDS, HH:MM:SS, "
            "DAYS-HH[:MM[:SS]]). The ranks get SIGUSR1 ahead of it (see --signal); over SSH "
            "the run is stopped at the limit (exit 124); under SLURM a job that reaches it "
            "is submitted again (see --max-resubmits).",
        ),
        click.option("--account", metavar="NAME", help="[slurm] Account to charge."),
        click.option("--job-name", metavar="NAME", help="[slurm] Job name. Default: the run id."),
        click.option(
            "--gpus-per-node",
            type=int,
            default=None,
            metavar="N",
            help="[slurm] GPUs per node (also the default --nproc-per-node).",
        ),
        click.option(
            "--cpus-per-node",
            type=int,
            default=None,
            metavar="N",
            help="[slurm] CPUs per node (the node's one task).",
        ),
        click.option(
            "--sbatch-arg",
            "sbatch_args",
            multiple=True,
            metavar="OPTION",
            help="[slurm] Any other sbatch option, written as an #SBATCH line after "
            "the others (repeatable), e.g. --sbatch-arg=--mem=64G.",
        ),
        click.option(
            "--signal",
            metavar="SIG@SECONDS",
            help="Send SIG (USR1 or USR2) to every rank that many seconds before the "
            "time limit (the bundled trainer saves a checkpoint and exits), e.g. "
            "USR1@300; none: no warning. Default with --time: USR1 120 s before it (a "
            "quarter of a limit under 8 minutes).",
        ),
        click.option(
            "--requeue",
            is_flag=True,
            help="[slurm] Let SLURM requeue the job; with --signal, the script "
            "requeues it once the ranks stopped on the signal, so it resumes "
            "(trainer: --checkpoint-dir DIR --resume).",
        ),
        click.option(
            "--max-resubmits",
            type=click.IntRange(min=0),
            default=None,
            metavar="N",
            help="[slurm] After the job ends by its time limit (or stops on the warning) or "
            "is preempted, submit it again, same run and command, up to N times; the "
            "program resumes from its checkpoint (trainer: --checkpoint-dir DIR --resume). "
            "A job cancelled by scancel or `orchestrator stop` is never resubmitted. "
            "[default: 10]",
        ),
    ]
    return functools.reduce(lambda f, option: option(f), reversed(options), func)


class HostfileOptional(click.Command):
    """Keeps the raw arguments, to tell `launch -- train.py` (no HOSTFILE) from
    `launch hosts.txt -- train.py`: click drops the `--` itself."""

    def parse_args(self, ctx, args):
        ctx.meta["raw_args"] = list(args)
        return super().parse_args(ctx, args)


def split_hostfile(hostfile: str | None, program: tuple[str, ...]):
    """A first positional argument that came after `--` is the program, not a HOSTFILE."""
    raw = click.get_current_context().meta.get("raw_args", [])
    if hostfile is not None and "--" in raw and hostfile not in raw[: raw.index("--")]:
        return None, (hostfile, *program)
    return hostfile, program
