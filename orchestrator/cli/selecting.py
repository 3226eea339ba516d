"""The flags that choose hosts out of the hostfile: DeepSpeed's selection, the bad-node
list, and the spares held back (launch, render; check has the first two). What they
choose: orchestrator.api.keywords.select."""

from __future__ import annotations

import functools

import click

from orchestrator.cli.options import DEFAULTS


def selection_options(func):
    """Choosing hosts and slots out of the hostfile, DeepSpeed's way; launch, render, check."""
    options = [
        click.option(
            "--include",
            metavar="NAME[:SLOTS][@NAME...]",
            help="Use only these hosts, and of a host given as NAME:0,2 only those "
            "slot ids, e.g. 'worker-0@worker-1:0,2'. Each node's "
            "CUDA_VISIBLE_DEVICES lists its chosen slot ids; LOCAL_RANK i runs on "
            "the i-th. DeepSpeed's --include.",
        ),
        click.option(
            "--exclude",
            metavar="NAME[:SLOTS][@NAME...]",
            help="Use every host and slot but these, e.g. 'worker-1:0' (a NAME alone "
            "drops the whole host). DeepSpeed's --exclude.",
        ),
        click.option(
            "--num-nodes",
            "--num_nodes",
            "num_nodes",
            type=int,
            default=None,
            metavar="N",
            help="Use the first N hosts of the hostfile. DeepSpeed's --num_nodes.",
        ),
        click.option(
            "--num-gpus",
            "--num_gpus",
            "num_gpus",
            type=int,
            default=None,
            metavar="N",
            help="Use slots 0..N-1 of every host (CUDA_VISIBLE_DEVICES "
            "0,...,N-1). DeepSpeed's --num_gpus.",
        ),
        click.option(
            "--bad-nodes",
            metavar="FILE",
            help="Skip the hosts listed in FILE (one a line; said in one line), as SLURM's "
            "--exclude. A launch adds a host there, with why and when, when a node fault "
            "takes it out. Default: no list.",
        ),
    ]
    return functools.reduce(lambda f, option: option(f), reversed(options), func)


def spares_option(func):
    """--spares N: launch and render."""
    return click.option(
        "--spares",
        type=click.IntRange(min=0),
        default=DEFAULTS.spares,
        show_default=True,
        metavar="N",
        help="Hold the last N hosts (after any selection) back as spares: probed, not "
        "started. When a node fault ends the run (the node lost, its disk failing, a rank "
        "killed by SIGKILL/SIGBUS from outside, a failed preflight probe), the next spare "
        "takes the node's rank and the job starts again with the same command, up to N "
        "times; a program that resumes from its checkpoint goes on from there. A rank that "
        "exits non-zero by itself is the job's error and uses no spare. With --backend slurm: "
        "after a node failure (NODE_FAIL) the job is submitted again without that node (a "
        "hostfile's last N hosts in its place, else one SLURM chooses), up to N times.",
    )(func)
