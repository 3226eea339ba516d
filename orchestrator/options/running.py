"""The run group: which backend runs it, where its record is kept, what is checked before
it starts (launch; render takes --run-id and --backend)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.options.backend_facts import CHOICES
from orchestrator.options.declare import OptionGroup, option
from orchestrator.sizes import parse_size

BACKENDS = CHOICES  # options/backend_facts.py: the names the registry knows, and auto
# Less free space where a node keeps its runs is worth a warning in the preflight.
MIN_FREE_DISK = "1G"
DEFAULT_RUN_DIR = "runs"  # where run records are kept: launch's --run-dir, attach(), runs()


def size(value: str | int) -> int:
    """A size as people write it (64M, 1G) or a number of bytes."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    return value if isinstance(value, int) else parse_size(value)


@dataclass(frozen=True)
class RunOptions(OptionGroup):
    """The run's own flags as given."""

    backend: str = option(
        "auto",
        "auto or ssh: SSH to the hosts (localhost entries run directly); local: every host "
        "must be this machine; slurm: one sbatch job (HOSTFILE optional, then --nodes; "
        "MASTER_PORT from the job id unless --master-port).",
        metavar="[" + "|".join(BACKENDS) + "]",
        choices=BACKENDS,
    )
    run_id: str | None = option(
        None,
        "Name of the run. Default: the time and a random suffix, e.g. 20261122-153012-a3f9.",
        metavar="NAME",
    )
    run_dir: str = option(DEFAULT_RUN_DIR, "Where run records are kept.", metavar="DIR")
    preflight: bool = option(
        True,
        "Skip probing the nodes (python, torch, interface, port) before starting.",
        name="--no-preflight",
        switch="off",
    )
    path_check: bool = option(
        True,
        "Skip the preflight's path check: every node connecting to the master's store port "
        "and to its peers on the NCCL/gloo interface before anything starts.",
        name="--no-path-check",
        switch="off",
    )
    min_free_disk: int = option(
        MIN_FREE_DISK,
        "The preflight warns about a node with less free space than this (64M, 1G, ...) "
        "where it keeps the run's files (~/.orchestrator/runs): a rank whose output does not "
        "fit fails, and the run then names the node's full disk.",
        metavar="SIZE",
        parse=size,
    )  # bytes, once read
    keep_node_logs: bool = option(
        False,
        "Keep each node's copy of the run's output (~/.orchestrator/runs/RUN on the node) "
        "after a successful run. Without it, a node's copy is removed once the run succeeded "
        "and this machine holds all of it; copies of runs that failed or stopped are kept "
        "until `orchestrator clean` removes them.",
        switch="on",
    )
