"""Restarts under torchrun's --max-restarts, as the run record counts and names them.

When a rank fails and its node's torchrun has restarts left, torchrun stops every worker
of the job (the failing node its own; the others, through the c10d rendezvous, theirs)
and starts them again: each rank ends exactly once per round. So a rank's n-th exit
belongs to round n, and a round in which a rank failed was a restart, unless it is the
last round and torchrun gave up. Each restart is named by the first rank to fail in it.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.supervise.state import RankState, describe_exit


@dataclass(frozen=True)
class RankExit:
    rank: int
    host: str
    exit_code: int
    ended_at: float  # the controller's clock


@dataclass
class Rounds:
    """Every rank exit by round, and the first failure of each round."""

    exits: dict[int, int]  # rank -> how many times it has ended so far
    causes: dict[int, RankExit]  # round -> its first failing rank
    finished: dict[int, int]  # round -> how many ranks have ended it

    @classmethod
    def empty(cls) -> Rounds:
        return cls({}, {}, {})

    def ended(self, rank: RankState, code: int, when: float, failed: bool) -> tuple[int, bool]:
        """Record an exit; returns its round and whether it is that round's first failure."""
        round_ = self.exits.get(rank.rank, 0)
        self.exits[rank.rank] = round_ + 1
        self.finished[round_] = self.finished.get(round_, 0) + 1
        if not failed:
            return round_, False
        first = self.causes.get(round_)
        if first is not None and first.ended_at <= when:
            return round_, False
        self.causes[round_] = RankExit(rank.rank, rank.host, code, when)
        return round_, first is None

    def round_of(self, rank: int) -> int:
        """The round of the rank's last exit (-1 before its first)."""
        return self.exits.get(rank, 0) - 1

    def last(self) -> int:
        return max(self.exits.values(), default=0) - 1

    def restarts(self, gave_up: bool) -> list[RankExit]:
        """The cause of each restart, in order; the last round is none when torchrun gave up."""
        rounds = sorted(self.causes)
        if gave_up and rounds and rounds[-1] == self.last():
            rounds.pop()
        return [self.causes[r] for r in rounds]


def describe_restart(number: int, cause: RankExit, started_wall: float) -> str:
    return (
        f"restart {number}: rank {cause.rank} on {cause.host} ended with "
        f"{describe_exit(cause.exit_code)} after {max(0.0, cause.ended_at - started_wall):.1f} s"
    )
