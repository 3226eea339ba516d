"""What `orchestrator check` expects and measures, as pure functions (standard library only).

Shared by the ranks of the collectives job (orchestrator.check.collectives), which compute and
compare with these, and by the controller, which reads their reports back. Nothing here
touches torch, the network or a file.

Expected values. The "scalar" cases are the classic ones, one int64 per rank:
  all_reduce(sum of tensor(rank))                -> n(n-1)/2 on every rank
  reduce_scatter(input list [tensor(rank)] * n)  -> n(n-1)/2 on every rank
  all_gather(tensor(rank))                       -> [0, 1, ..., n-1] on every rank
  broadcast(tensor(n) from rank 0)               -> n on every rank
The "vector" cases run the same ops on PATTERN_LENGTH int64 elements whose values depend on
rank, chunk and index (`pattern`), so a dropped, duplicated or misplaced element shows.

Bandwidth follows nccl-tests: algbw = size / time, and the bus bandwidth, comparable across
world sizes, is algbw * 2(n-1)/n for all_reduce and algbw * (n-1)/n for all_gather, whose
size is the gathered total (n times what each rank sends).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MARKER = "ORCHESTRATOR_CHECK "  # prefix of every machine-readable line a rank prints
OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")
BANDWIDTH_OPS = ("all_reduce", "all_gather")
PATTERN_LENGTH = 999  # odd and not a power of two: uneven splits show up
ELEMENT_BYTES = 4  # float32 buffers for the bandwidth sweep
MIN_SIZE = 1024
DEFAULT_MAX_SIZE = {"gloo": 64 << 20, "nccl": 1 << 30}
# The torch.distributed backends (not the launch's) whose every rank needs a GPU of its own.
ON_GPUS = frozenset({"nccl"})


def on_gpus(backend: str) -> bool:
    """Whether the collective backend `backend` runs on one GPU per rank (NCCL; gloo: CPU)."""
    return backend in ON_GPUS


def sweep_sizes(max_size: int, min_size: int = MIN_SIZE) -> list[int]:
    """Sizes doubling from min_size up to max_size; max_size itself is always the last."""
    if max_size < min_size:
        return [max_size]
    sizes = []
    size = min_size
    while size < max_size:
        sizes.append(size)
        size *= 2
    sizes.append(max_size)
    return sizes


def elements_per_rank(op: str, size: int, world_size: int) -> int:
    """How many float32 elements each rank sends for one `op` of `size` bytes.

    all_gather's size is the gathered total, so each rank sends 1/n of it (rounded down,
    at least one element, as nccl-tests does).
    """
    count = max(1, size // ELEMENT_BYTES)
    if op == "all_gather":
        count = max(1, count // world_size)
    return count


def bytes_moved(op: str, count: int, world_size: int) -> int:
    """The size nccl-tests reports for one op with `count` elements per rank."""
    total = count * ELEMENT_BYTES
    return total * world_size if op == "all_gather" else total


# --- bandwidth -------------------------------------------------------------------------


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' bus bandwidth factor: 2(n-1)/n for all_reduce, (n-1)/n for all_gather."""
    n = world_size
    if n < 1:
        raise ValueError(f"world size must be positive, got {n}")
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"no bus bandwidth factor for {op!r}")


def algbw_gbs(size: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (10^9 bytes per second): size / time."""
    if seconds <= 0:
        raise ValueError(f"time must be positive, got {seconds}")
    return size / seconds / 1e9


def busbw_gbs(op: str, size: int, seconds: float, world_size: int) -> float:
    """Bus bandwidth in GB/s: algbw times the op's factor (see `bus_factor`)."""
    return algbw_gbs(size, seconds) * bus_factor(op, world_size)


TIME_PER_SIZE_S = 0.25  # how long the timed iterations of one size should take, roughly
MIN_ITERS, MAX_ITERS = 2, 20


def warmup_iterations(size: int) -> int:
    """Warm-up iterations before timing one size: two for small messages, one for big."""
    return 2 if size <= 1 << 20 else 1


def timed_iterations(warmup_seconds: float) -> int:
    """How many iterations to time, given the slowest rank's last warm-up: as many as fit
    in TIME_PER_SIZE_S, from MIN_ITERS to MAX_ITERS (nccl-tests always times 20; a
    preflight keeps the big sizes short). Every rank must pass the same value."""
    if warmup_seconds <= 0:
        return MAX_ITERS
    return max(MIN_ITERS, min(MAX_ITERS, int(TIME_PER_SIZE_S / warmup_seconds)))


@dataclass(frozen=True)
class BandwidthRow:
    op: str
    size: int  # bytes, as nccl-tests reports them
    count: int  # elements each rank sends
    seconds: float  # mean time of one op (timed iterations, averaged over ranks)
    world_size: int
    warmup: int
    iters: int

    @property
    def algbw(self) -> float:
        return algbw_gbs(self.size, self.seconds)

    @property
    def busbw(self) -> float:
        return busbw_gbs(self.op, self.size, self.seconds, self.world_size)

    def to_dict(self) -> dict:
        return {
            "op": self.op,
            "size_bytes": self.size,
            "count": self.count,
            "time_us": self.seconds * 1e6,
            "algbw_gbs": self.algbw,
            "busbw_gbs": self.busbw,
            "warmup": self.warmup,
            "iters": self.iters,
        }


# --- expected values -------------------------------------------------------------------


def pattern(rank: int, chunk: int, index: int) -> int:
    """The value a rank puts at `index` of `chunk`: readable as rank|chunk|index in decimal."""
    return rank * 1_000_000 + chunk * 1_000 + index


def scalar_input(op: str, rank: int, world_size: int) -> int:
    """What rank `rank` contributes in the scalar case (broadcast: only rank 0 matters)."""
    if op == "broadcast":
        return world_size if rank == 0 else 0
    return rank


def expected_scalar(op: str, rank: int, world_size: int) -> list[int]:
    """The exact result on `rank` of the scalar case of `op` (a list, like tensor.tolist())."""
    n = world_size
    if op in ("all_reduce", "reduce_scatter"):
        return [n * (n - 1) // 2]
    if op == "all_gather":
        return list(range(n))
    if op == "broadcast":
        return [n]
    raise ValueError(f"unknown op {op!r}")


def broadcast_root(world_size: int) -> int:
    """The vector broadcast comes from the last rank (the scalar one from rank 0)."""
    return world_size - 1


def vector_input(
    op: str, rank: int, world_size: int, length: int = PATTERN_LENGTH
) -> list[list[int]]:
    """What rank `rank` contributes in the vector case: one list per chunk.

    reduce_scatter has one chunk per destination rank; all_gather, all_reduce and
    broadcast have one.
    """
    chunks = world_size if op == "reduce_scatter" else 1
    return [[pattern(rank, chunk, i) for i in range(length)] for chunk in range(chunks)]


def expected_vector(op: str, rank: int, world_size: int, length: int = PATTERN_LENGTH) -> list[int]:
    """The exact result on `rank` of the vector case of `op`, flattened."""
    n = world_size
    ranks_sum = n * (n - 1) // 2
    if op == "all_reduce":  # sum over r of pattern(r, 0, i)
        return [ranks_sum * 1_000_000 + n * i for i in range(length)]
    if op == "reduce_scatter":  # rank j gets the sum of every rank's chunk j
        return [ranks_sum * 1_000_000 + n * (rank * 1_000 + i) for i in range(length)]
    if op == "all_gather":  # every rank's chunk 0, in rank order
        return [pattern(r, 0, i) for r in range(n) for i in range(length)]
    if op == "broadcast":
        return [pattern(broadcast_root(n), 0, i) for i in range(length)]
    raise ValueError(f"unknown op {op!r}")


@dataclass(frozen=True)
class Mismatch:
    index: int | None  # None: the lengths differ
    got: object
    expected: object
    wrong: int  # how many elements differ

    def describe(self) -> str:
        if self.index is None:
            return f"got {self.got} element(s), expected {self.expected}"
        more = f" ({self.wrong} element(s) wrong)" if self.wrong > 1 else ""
        return f"element {self.index} is {self.got}, must be {self.expected}{more}"


def first_mismatch(got: Sequence[object], expected: Sequence[object]) -> Mismatch | None:
    """The first element where `got` differs from `expected`, or None when they are equal."""
    if len(got) != len(expected):
        return Mismatch(None, len(got), len(expected), abs(len(got) - len(expected)))
    wrong = [i for i, (g, e) in enumerate(zip(got, expected, strict=True)) if g != e]
    if not wrong:
        return None
    return Mismatch(wrong[0], got[wrong[0]], expected[wrong[0]], len(wrong))


def describe_expected(op: str, case: str, world_size: int) -> str:
    """The expected result in words, for the report."""
    n = world_size
    if case == "scalar":
        if op == "all_gather":
            shown = expected_scalar(op, 0, n)
            text = str(shown) if n <= 8 else f"[0, 1, ..., {n - 1}]"
            return f"{text} on every rank"
        value = expected_scalar(op, 0, n)[0]
        return f"{value} on every rank"
    if op == "all_reduce":
        return f"{n} ranks' patterns summed"
    if op == "reduce_scatter":
        return "rank j: every rank's chunk j summed"
    if op == "all_gather":
        return "every rank's pattern, in rank order"
    if op == "broadcast":
        return f"rank {broadcast_root(n)}'s pattern on every rank"
    raise ValueError(f"unknown op {op!r}")


# --- the report lines ------------------------------------------------------------------


def report_line(record: dict) -> str:
    """One machine-readable line: MARKER + compact JSON."""
    return MARKER + json.dumps(record, separators=(",", ":"), sort_keys=True)


def parse_report_lines(lines: Iterable[str]) -> list[dict]:
    """The records in a rank's log (other lines, and damaged records, are skipped)."""
    records = []
    for line in lines:
        start = line.find(MARKER)
        if start < 0:
            continue
        try:
            record = json.loads(line[start + len(MARKER) :])
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
