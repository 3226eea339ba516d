"""The hosts group: which hosts of the hostfile a run uses, DeepSpeed's way, and which it
holds back (launch, render; check takes all but --spares). hosts/selection.py applies it."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.options.declare import OptionGroup, option

CHOOSING = ("include", "exclude", "num_nodes", "num_gpus")  # the flags that pick hosts/slots


@dataclass(frozen=True)
class Selection(OptionGroup):
    """The host-choosing flags as given (None: not given)."""

    include: str | None = option(
        None,
        "Use only these hosts, and of a host given as NAME:0,2 only those slot ids, e.g. "
        "'worker-0@worker-1:0,2'. Each node's CUDA_VISIBLE_DEVICES lists its chosen slot "
        "ids; LOCAL_RANK i runs on the i-th. DeepSpeed's --include (and -i).",
        metavar="NAME[:SLOTS][@NAME...]",
        aliases=("-i",),
    )
    exclude: str | None = option(
        None,
        "Use every host and slot but these, e.g. 'worker-1:0' (a NAME alone drops the whole "
        "host). DeepSpeed's --exclude (and -e).",
        metavar="NAME[:SLOTS][@NAME...]",
        aliases=("-e",),
    )
    num_nodes: int | None = option(
        None,
        "Use the first N hosts of the hostfile. DeepSpeed's --num_nodes.",
        metavar="N",
        aliases=("--num_nodes",),
        kind=int,
    )
    num_gpus: int | None = option(
        None,
        "Use slots 0..N-1 of every host (CUDA_VISIBLE_DEVICES 0,...,N-1). DeepSpeed's --num_gpus.",
        metavar="N",
        aliases=("--num_gpus",),
        kind=int,
    )
    bad_nodes: str | None = option(
        None,
        "Skip the hosts listed in FILE (one a line; said in one line), as SLURM's --exclude. "
        "A launch adds a host there, with why and when, when a node fault takes it out. "
        "Default: no list.",
        metavar="FILE",
    )  # applied before the flags above
    spares: int = option(
        0,
        "Hold the last N hosts (after any selection) back as spares: probed, not started. "
        "When a node fault ends the run (the node lost, its disk failing, a rank killed by "
        "SIGKILL/SIGBUS from outside, a failed preflight probe), the next spare takes the "
        "node's rank and the job starts again with the same command, up to N times; a "
        "program that resumes from its checkpoint goes on from there. A rank that exits "
        "non-zero by itself is the job's error and uses no spare. With --backend slurm: "
        "after a node failure (NODE_FAIL) the job is submitted again without that node (a "
        "hostfile's last N hosts in its place, else one SLURM chooses), up to N times.",
        metavar="N",
        kind=int,
        minimum=0,
    )
    min_nodes: int | None = option(
        None,
        "Go on with fewer nodes, down to K. With no spare left (or none held), a node that "
        "is lost or fails as a node (the node lost, its disk, a process there killed from "
        "outside) no longer ends the run while at least K nodes answer: the run starts "
        "again from its checkpoint on the survivors (node ranks renumbered, the master "
        "moved if its node was lost; every rank told the new world, "
        "ORCHESTRATOR_LAUNCH_WORLD_SIZE the one launched with, so the bundled trainer keeps "
        "its global batch). Over SSH the hosts it does not run on (lost, left out at the "
        "start, or added to the hostfile since) are asked again: one that answers joins at "
        "the next checkpoint, or is held as a spare at full size. At the start, hosts that "
        "fail the preflight are left out while at least K pass. A rank that fails by itself "
        "still fails the run. Default: every node is needed.",
        metavar="K",
        kind=int,
        minimum=1,
    )

    @property
    def given(self) -> bool:
        """Whether a flag chose hosts or slots (the bad-node list and spares do not count)."""
        return any(getattr(self, name) is not None for name in CHOOSING)

    def describe(self) -> str:
        """The choosing flags as a command line would show them, for the plan."""
        return " ".join(
            f"--{name.replace('_', '-')} {getattr(self, name)}"
            for name in CHOOSING
            if getattr(self, name) is not None
        )
