"""The `check` command: prove that the nodes of a hostfile are ready for a job."""

from __future__ import annotations

import sys

import click

from orchestrator.api.node_tasks import check_nodes
from orchestrator.cli.context import CONTEXT
from orchestrator.cli.options import container_options, note, run_dir_option, ssh_options
from orchestrator.cli.selecting import selection_options


@click.command(context_settings=CONTEXT)
@click.argument("hostfile", type=click.Path())
@click.option(
    "--nproc-per-node",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Ranks per node. Default: each host's slots (1 for a bare host).",
)
@click.option(
    "--master-addr",
    metavar="ADDR",
    help="Rendezvous address to test. Default: the first node, as reached by ssh.",
)
@click.option(
    "--master-port",
    default="auto",
    show_default=True,
    metavar="PORT|auto",
    help="Rendezvous port to test and use. 'auto': 29500 when free on the master, else a free one.",
)
@click.option(
    "--ifname",
    metavar="IFACE",
    help="Interface for NCCL and gloo on every node (a hostfile ifname wins). "
    "Default: the one whose route reaches MASTER_ADDR.",
)
@click.option(
    "--python",
    metavar="PATH",
    help="Interpreter on every node. Default: this orchestrator's interpreter path; "
    "a hostfile python wins for its node.",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "nccl", "gloo"]),
    default="auto",
    show_default=True,
    help="auto: NCCL when every node has CUDA devices, else gloo.",
)
@click.option(
    "--max-size",
    metavar="SIZE",
    help="Largest message of the bandwidth sweep (from 1K, doubling), e.g. 64M or "
    "1G. Default: 64M with gloo, 1G with NCCL.",
)
@click.option("--skip-bandwidth", is_flag=True, help="Check the collectives only.")
@click.option(
    "--json",
    "json_path",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="Also write the whole report as JSON to FILE.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=180.0,
    show_default=True,
    metavar="SECONDS",
    help="Give up on the collectives job after this long.",
)
@click.option(
    "--run-id",
    metavar="NAME",
    help="Name of the check's run. Default: the time and a random suffix.",
)
@run_dir_option
@selection_options
@container_options
@ssh_options
def check(
    hostfile,
    nproc_per_node,
    master_addr,
    master_port,
    ifname,
    python,
    backend,
    max_size,
    skip_bandwidth,
    json_path,
    timeout,
    run_id,
    run_dir,
    container,
    container_runtime,
    container_mounts,
    container_workdir,
    container_args,
    container_python,
    **ssh,
):
    """Prove that the nodes of HOSTFILE are ready for a job.

    Per node, in parallel: SSH round trip, python, torch, NCCL, CUDA devices vs slots, the
    NCCL/gloo interface and whether it can open a TCP connection to MASTER_ADDR:MASTER_PORT,
    free disk. Then a real job on every slot (a normal run in --run-dir): all_reduce,
    reduce_scatter, all_gather, broadcast and barrier, each checked against the exact value
    every rank must get, and an all_reduce/all_gather bandwidth sweep (algbw and busbw as
    nccl-tests computes them). Exit status 0 only when everything passed; otherwise 1, with
    what to fix.
    """
    return check_nodes(
        hostfile, nproc_per_node=nproc_per_node, master_addr=master_addr,
        master_port=master_port, ifname=ifname, python=python, backend=backend,
        max_size=max_size, skip_bandwidth=skip_bandwidth, json_path=json_path,
        timeout=timeout, run_id=run_id, run_dir=run_dir, argv=("orchestrator", *sys.argv[1:]),
        container=container, container_runtime=container_runtime,
        container_mounts=container_mounts, container_workdir=container_workdir,
        container_args=container_args, container_python=container_python,
        say=note, **ssh,
    )  # fmt: skip
