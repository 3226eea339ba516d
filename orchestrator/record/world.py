"""The world a run ran on over time, as the run record keeps it: status.json's `world`
entries (one per attempt: its nodes, its ranks, since when, why it changed), their lines in
words, and the time spent on fewer nodes than the run was launched with (--min-nodes)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.record.runs import now_iso


@dataclass
class AttemptWorld:
    """The nodes and ranks of one attempt, from when it was planned."""

    attempt: int
    nodes: tuple[str, ...]  # in node-rank order
    ranks: int
    since: float  # the controller's clock
    why: str  # "launch", "ceon3 (lost: ...) left out, ...", "ceon2 (...) replaced by ceon4 ..."
    running_at: float | None = None  # when every node of the attempt ran

    def to_dict(self) -> dict:
        return {
            "attempt": self.attempt,
            "nodes": list(self.nodes),
            "ranks": self.ranks,
            "since": now_iso(self.since),
            "running_at": now_iso(self.running_at) if self.running_at else None,
            "why": self.why,
        }


def describe_world(entry: dict) -> str:
    """One world entry as status.json holds it, in words."""
    nodes = entry["nodes"]
    return (
        f"attempt {entry['attempt']}: {len(nodes)} node(s), {entry['ranks']} rank(s) since "
        f"{entry['since']} ({entry['why']}): {', '.join(nodes)}"
    )


def seconds_on_fewer_nodes(world: Sequence[AttemptWorld], until: float) -> float:
    """How long the run ran on fewer nodes than its first attempt's, up to `until`."""
    if not world:
        return 0.0
    launched = len(world[0].nodes)
    ends = [later.since for later in world[1:]] + [until]
    return sum(
        max(0.0, end - entry.since)
        for entry, end in zip(world, ends, strict=True)
        if len(entry.nodes) < launched
    )


def fewer_nodes_line(world: Sequence[AttemptWorld], until: float) -> str | None:
    """The summary's last line when the run went on with fewer nodes; None when it never did."""
    if not world or all(len(s.nodes) >= len(world[0].nodes) for s in world):
        return None
    launched = len(world[0].nodes)
    least = min(len(s.nodes) for s in world)
    seconds = seconds_on_fewer_nodes(world, until)
    return (
        f"on fewer nodes than the {launched} launched with for {seconds:.1f} s "
        f"(down to {least}; --min-nodes)"
    )


def going_on_line(what: str, left: int, launched: int, min_nodes: int) -> str:
    """The console's line for a node fault the run survives on fewer nodes (--min-nodes);
    `what`: the node(s) and what happened (`ceon3 lost`)."""
    return (
        f"{what}; no spare left; going on with {left} of {launched} nodes (--min-nodes {min_nodes})"
    )


def floor_line(what: str, left: int, launched: int, min_nodes: int) -> str:
    """Why a node fault ended the run: fewer than --min-nodes nodes are left."""
    return (
        f"{what}; no spare left; {left} of {launched} nodes left, below --min-nodes "
        f"{min_nodes}: the floor was reached"
    )
