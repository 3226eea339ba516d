"""A node replaced by a spare (--spares), as the run record keeps it: status.json's
`recoveries` entries and their one line in words."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.record.runs import now_iso


@dataclass
class Recovery:
    """One node replaced by a spare."""

    attempt: int  # the attempt the replacement started
    node_rank: int
    node: str
    why: str
    spare: str
    noticed_at: float  # the controller's clock
    running_at: float | None = None  # when every node ran again

    def to_dict(self) -> dict:
        return {
            "attempt": self.attempt,
            "node_rank": self.node_rank,
            "node": self.node,
            "why": self.why,
            "spare": self.spare,
            "noticed_at": now_iso(self.noticed_at),
            "running_again_at": now_iso(self.running_at) if self.running_at else None,
            "seconds_to_running": (
                round(self.running_at - self.noticed_at, 1) if self.running_at else None
            ),
        }

    def describe(self) -> str:
        return describe_recovery(self.to_dict())


def describe_recovery(entry: dict) -> str:
    """One recovery as status.json holds it, in words."""
    seconds = entry.get("seconds_to_running")
    again = f"; running again {seconds:.1f} s later" if seconds is not None else ""
    return (
        f"{entry['node']} ({entry['why']}) replaced by {entry['spare']} as node "
        f"{entry['node_rank']}{again}"
    )
