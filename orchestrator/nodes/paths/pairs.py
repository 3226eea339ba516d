"""Which node connects to which in the path check: every ordered pair up to ALL_PAIRS_UP_TO
nodes, beyond it PEERS_PER_NODE peers per node (its ring successor and random others). Pure.

Up to ALL_PAIRS_UP_TO nodes every node connects to every other, both ways: each node makes
and answers n - 1 connections at once (63 at 64 nodes: far under a node's file descriptor
limit and listen backlog, and a few milliseconds of CPU), so every path the job's mesh
will use is proven. Beyond it the per-node cost stays that of 64 nodes: node i connects to
i + 1 (the ring: every node is proven to reach one peer and be reached by one) and to
PEERS_PER_NODE - 1 others drawn at random (a new seed at every launch). What that proves:

- every node reaches the master's store port (always, at any size);
- a node that cannot reach any peer, or cannot be reached, is caught with certainty;
- a node that cannot reach a fraction f of the others is caught unless all of its 63
  outgoing draws miss them: probability (1 - f)^63 (f = 10%: 0.13%);
- one bad pair (A, B) alone is caught when A drew B or B drew A (`pair_coverage`): about
  75% at 128 nodes, 43% at 256, 12% at 1024; a new draw at every launch finds it soon.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

ALL_PAIRS_UP_TO = 64
PEERS_PER_NODE = ALL_PAIRS_UP_TO - 1


def choose_peers(n: int, seed: int | str = 0) -> tuple[tuple[int, ...], ...]:
    """For every node (by index), the nodes it connects to, in ascending order."""
    if n <= ALL_PAIRS_UP_TO:
        return tuple(tuple(j for j in range(n) if j != i) for i in range(n))
    draw = random.Random(f"paths {n} {seed}")
    chosen = []
    for i in range(n):
        ring = (i + 1) % n
        others = [j for j in range(n) if j not in (i, ring)]
        chosen.append(tuple(sorted([ring, *draw.sample(others, PEERS_PER_NODE - 1)])))
    return tuple(chosen)


def incoming(peers: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """For every node, the nodes that connect to it."""
    found: list[list[int]] = [[] for _ in peers]
    for i, targets in enumerate(peers):
        for j in targets:
            found[j].append(i)
    return tuple(tuple(sorted(f)) for f in found)


@dataclass(frozen=True)
class Schedule:
    """Who connects to whom in one check: `peers[i]` the nodes node i connects to,
    `sources[i]` those that connect to it. Drawn once per check, however many nodes'
    arguments are rendered from it (a draw costs O(n^2))."""

    peers: tuple[tuple[int, ...], ...]
    sources: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, n: int, seed: int | str = 0) -> Schedule:
        peers = choose_peers(n, seed)
        return cls(peers, incoming(peers))


def pair_coverage(n: int) -> float:
    """The chance that one given unordered pair is tested (one way or the other)."""
    if n <= ALL_PAIRS_UP_TO:
        return 1.0
    missed_one_way = 1 - (PEERS_PER_NODE - 1) / (n - 2)
    ring = 2 / (n - 1)  # the pair may be ring neighbours
    return ring + (1 - ring) * (1 - missed_one_way**2)


def scheme(n: int) -> str:
    """One line for the console: what the check of `n` nodes proves."""
    if n <= ALL_PAIRS_UP_TO:
        return f"every node to the store and to every other node ({n * (n - 1)} peer paths)"
    return (
        f"every node to the store, to its ring neighbour and to {PEERS_PER_NODE - 1} random "
        f"peers ({n * PEERS_PER_NODE} peer paths; one bad pair found with p = "
        f"{pair_coverage(n):.0%})"
    )
