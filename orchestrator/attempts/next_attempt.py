"""The one decision of what follows an attempt, for every backend. Pure.

An attempt ends; the run then goes on in a next attempt or ends. The facts that decide it
(`AttemptEnd`) are the same whatever ran it: how many nodes the attempt ran on, how many a
fault took out, the spares left (--spares), the floor (--min-nodes), the nodes back that the
ranks stopped at a checkpoint for (growing back), and whether the attempt stopped for a time
limit or a preemption with resubmissions left (SLURM's --max-resubmits). In that order:

- a node lost, a spare left: `SPARE`, a spare takes its place;
- a node lost, no spare left, at least --min-nodes left: `SHRINK`, the nodes left go on
  from the checkpoint with the same global batch;
- a node lost, fewer left than --min-nodes: `FLOOR`, the run ends lost, naming the floor;
  with no --min-nodes: `UNREPLACED`, the run ends as the fault says;
- nodes back and the ranks stopped at their checkpoint for them: `GROW`;
- a time limit's or a preemption's stop with resubmissions left: `RESUBMIT`, the same world;
- else (done, failed, stopped, cancelled): `END`.

A Ctrl-C to the orchestrator ends the run whatever else the attempt saw.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Next(str, Enum):
    """What follows an attempt."""

    SPARE = "spare"  # a spare takes the lost node's place (--spares)
    SHRINK = "shrink"  # the nodes left go on (--min-nodes)
    GROW = "grow"  # nodes back: the ranks stopped at a checkpoint for them
    RESUBMIT = "resubmit"  # the same world again, after a time limit or a preemption
    FLOOR = "floor"  # a node lost and fewer than --min-nodes left: the run ends lost
    UNREPLACED = "unreplaced"  # a node lost, no spare left, no --min-nodes: the run ends
    END = "end"  # the run ended by itself

    @property
    def goes_on(self) -> bool:
        """Whether the run goes on in a next attempt."""
        return self in (Next.SPARE, Next.SHRINK, Next.GROW, Next.RESUBMIT)


@dataclass(frozen=True)
class AttemptEnd:
    """The facts of an attempt that ended, as a backend saw them."""

    nodes: int  # the nodes it ran on
    lost: int = 0  # of them, the nodes a fault took out
    spares_left: int = 0
    min_nodes: int | None = None  # --min-nodes (None or 0: not given)
    back: int = 0  # nodes back that the ranks stopped at their checkpoint for
    resubmit: bool = False  # stopped for a time limit or a preemption, resubmissions left
    interrupted: bool = False  # Ctrl-C (or SIGTERM) to the orchestrator


def next_attempt(end: AttemptEnd) -> Next:
    """What follows `end`; see the module docstring."""
    if end.interrupted:
        return Next.END
    if end.lost:
        if end.spares_left > 0:
            return Next.SPARE
        if not end.min_nodes:
            return Next.UNREPLACED
        return Next.SHRINK if end.nodes - end.lost >= end.min_nodes else Next.FLOOR
    if end.back:
        return Next.GROW
    return Next.RESUBMIT if end.resubmit else Next.END
