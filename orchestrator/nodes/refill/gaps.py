"""A gap: the stretch of a controller's rank file that holds only part of what the rank
printed, and where on its node the whole of it is (as status.json records it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import ConfigError


@dataclass(frozen=True)
class Gap:
    """Bytes [offset, end) of logs/rank-N.log hold only the start of the node's rank-N.out."""

    rank: int
    host: str
    node_dir: str  # on the node, `~` its home
    offset: int
    end: int
    python: str  # the node's interpreter, to run its agent
    user: str | None = None
    port: int | None = None
    why: str = ""  # why the last fill failed

    def as_status(self) -> dict:
        """Its entry in status.json's incomplete_logs."""
        entry = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        return entry if self.why else {k: v for k, v in entry.items() if k != "why"}

    @classmethod
    def from_status(cls, entry: object, where: Path) -> Gap:
        """An entry of status.json's incomplete_logs; ConfigError if it is not one."""
        names = {field.name for field in dataclasses.fields(cls)}
        gap = None
        if isinstance(entry, dict) and set(entry) <= names:
            try:
                gap = cls(**entry)
            except TypeError:  # a field missing
                gap = None
        if gap is None or not gap.well_formed():
            raise ConfigError(f"{where}: unreadable entry in incomplete_logs: {entry!r}")
        return gap

    def well_formed(self) -> bool:
        numbers = (self.rank, self.offset, self.end)
        return (
            all(isinstance(n, int) and not isinstance(n, bool) for n in numbers)
            and 0 <= self.offset <= self.end
            and all(isinstance(t, str) and t for t in (self.host, self.node_dir, self.python))
            and isinstance(self.why, str)
            and (self.user is None or isinstance(self.user, str))
            and (self.port is None or isinstance(self.port, int))
        )

    @property
    def node(self) -> tuple[str, str | None, int | None]:
        return (self.host, self.user, self.port)

    def copy(self) -> str:
        """Where the node keeps the rank's whole output: host:~/.orchestrator/runs/..."""
        return f"{self.host}:{self.node_dir}/rank-{self.rank}.out"


def rank_files(gaps: Sequence[Gap] | Sequence[int], verbs: tuple[str, str] = ("is", "are")) -> str:
    """'rank file 3 is' or 'rank files 0, 3 are' (or other verbs)."""
    ranks = sorted({gap.rank if isinstance(gap, Gap) else gap for gap in gaps})
    listed = ", ".join(str(rank) for rank in ranks)
    return (
        f"rank file {listed} {verbs[0]}" if len(ranks) == 1 else f"rank files {listed} {verbs[1]}"
    )
