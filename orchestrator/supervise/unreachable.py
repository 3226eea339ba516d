"""A node whose processes get no answer from the store or a peer (the agent's U frame,
orchestrator.agent.connects): which node the address is, and the line that names the pair.

The agents send their node's addresses with S; an address no node has is the job's own
business (a download, a service outside the run) and only said, never a verdict; the store
is node 0's whatever address it was reached at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.supervise.state import NodeState


def parse_addresses(field: str) -> tuple[str, ...]:
    """The addresses of S's `eth0=10.0.0.2,ib0=10.1.0.2` field (`-`: none known)."""
    return tuple(pair.partition("=")[2] for pair in field.split(",") if "=" in pair)


def node_at(nodes: Sequence[NodeState], address: str) -> NodeState | None:
    """The node holding `address`: one of its agent's addresses, or its host as written."""
    for node in nodes:
        if address in node.addresses or address == node.host:
            return node
    return None


def process_words(who: str) -> str:
    """`rank3` -> `rank 3`; `torchrun` as it is (a U frame's last field)."""
    return f"rank {who[4:]}" if who.startswith("rank") and who[4:].isdigit() else who


@dataclass(frozen=True)
class NoAnswer:
    """What a U frame says, with the nodes at both ends."""

    node: NodeState  # whose processes got no answer
    peer: NodeState | None  # the node holding the address; None: no node of the run
    address: str
    port: int
    seconds: float
    store: bool  # MASTER_ADDR:MASTER_PORT, as the process was given it
    who: str  # rank3, torchrun

    @classmethod
    def of(cls, nodes: Sequence[NodeState], node: NodeState, fields: Sequence[str]) -> NoAnswer:
        """From U's fields: addr port seconds store|peer who."""
        address, port, seconds, role, who = fields[:5]
        store = role == "store"
        peer = node_at(nodes, address) or (nodes[0] if store and nodes else None)
        return cls(node, peer, address, int(port), float(seconds), store, who)

    @property
    def pair(self) -> tuple[int, int] | None:
        """The two nodes, lowest first: one pair, whichever end said it."""
        if self.peer is None:
            return None
        return tuple(sorted((self.node.index, self.peer.index)))  # type: ignore[return-value]

    def line(self) -> str:
        """One line: both nodes, the address and port, and what happened."""
        what = "the store" if self.store else "a peer's port"
        where = f"on {self.peer.host} " if self.peer is not None else ""
        of_no_node = "" if self.peer is not None else " (an address of no node of this run)"
        return (
            f"{self.node.host} cannot reach {what} {where}at {self.address}:{self.port}"
            f"{of_no_node}: {process_words(self.who)}'s connection got no answer for "
            f"{self.seconds:.0f} s (packets dropped on the way: a firewall rule or a route)"
        )
