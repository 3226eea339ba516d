"""The `check` command: prove that the nodes of a hostfile are ready for a job."""

from __future__ import annotations

import sys

import click

from orchestrator.api.node_tasks import CHECK_HOSTS, CHECK_JOB, check_nodes
from orchestrator.cli.context import CONTEXT
from orchestrator.cli.flags import note, options_of
from orchestrator.options.checking import CollectiveOptions
from orchestrator.options.choosing import Selection
from orchestrator.options.image import ContainerOptions
from orchestrator.options.reaching import SshOptions
from orchestrator.options.running import RunOptions
from orchestrator.options.workload import JobOptions

CHECK_HELPS = {
    "master_addr": "Rendezvous address to test. Default: the first node, as reached by ssh.",
    "master_port": "Rendezvous port to test and use. 'auto': 29500 when free on the master, "
    "else a free one.",
    "ifname": "Interface for NCCL and gloo on every node (a hostfile ifname wins). Default: "
    "the one whose route reaches MASTER_ADDR.",
    "python": "Interpreter on every node. Default: this orchestrator's interpreter path; a "
    "hostfile python wins for its node.",
    "run_id": "Name of the check's run. Default: the time and a random suffix.",
}


@click.command(context_settings=CONTEXT)
@click.argument("hostfile", type=click.Path())
@options_of(JobOptions, CHECK_JOB, helps=CHECK_HELPS)
@options_of(CollectiveOptions)
@options_of(RunOptions, ["run_id", "run_dir"], helps=CHECK_HELPS)
@options_of(Selection, CHECK_HOSTS)
@options_of(ContainerOptions)
@options_of(SshOptions)
def check(hostfile, **keywords):
    """Prove that the nodes of HOSTFILE are ready for a job.

    Per node, in parallel: SSH round trip, python, torch, NCCL, CUDA devices vs slots, the
    NCCL/gloo interface and whether it can open a TCP connection to MASTER_ADDR:MASTER_PORT,
    free disk. Then a real job on every slot (a normal run in --run-dir): all_reduce,
    reduce_scatter, all_gather, broadcast and barrier, each checked against the exact value
    every rank must get, and an all_reduce/all_gather bandwidth sweep (algbw and busbw as
    nccl-tests computes them). Exit status 0 only when everything passed; otherwise 1, with
    what to fix.
    """
    argv = ("orchestrator", *sys.argv[1:])
    return check_nodes(hostfile, argv=argv, say=note, **keywords)
