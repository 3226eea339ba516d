"""Filling gaps: each node's rank-N.out fetched through its agent (a small standard-library
program, as orchestrator.nodes.copies runs its steps) into a new rank file written beside the old
one, then renamed over it."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from orchestrator.backends.base import NodeConnection
from orchestrator.errors import Interrupted, OrchestratorError
from orchestrator.nodes.execute import CaptureSink, last_line, run_on_nodes
from orchestrator.nodes.refill.gaps import Gap

COPY_BLOCK = 1 << 20
# Run by the node's python: argv pairs of (node directory, rank). Each rank-N.out goes to
# stdout as base64 lines `D I DATA` and `end I SIZE`, or `missing I WHY`; I counts the pairs.
FETCH_RANKS = r"""
import base64, os, sys
args = sys.argv[1:]
for index in range(len(args) // 2):
    folder, rank = args[2 * index], args[2 * index + 1]
    path = os.path.join(os.path.expanduser(folder), "rank-%s.out" % rank)
    try:
        handle = open(path, "rb")
    except OSError as exc:
        print("missing", index, "%s: %s" % (path, exc.strerror or exc), flush=True)
        continue
    size = 0
    with handle:
        while True:
            chunk = handle.read(49152)
            if not chunk:
                break
            size += len(chunk)
            sys.stdout.write("D %d %s\n" % (index, base64.b64encode(chunk).decode("ascii")))
    print("end", index, size, flush=True)
"""


class Refill:
    """The new rank file for one gap, written beside the old one as the node's copy arrives."""

    def __init__(self, gap: Gap, logs_dir: Path, mask: Callable[[bytes], bytes]) -> None:
        self.gap, self.mask = gap, mask
        self.path = logs_dir / f"rank-{gap.rank}.log"
        self.tmp = logs_dir / f".rank-{gap.rank}.log.refill"
        self.out = None
        self.partial = b""
        self.received = 0
        self.old_size = 0
        self.new_size: int | None = None  # set once the new file is whole
        self.why = ""
        self.gone = False  # the node's copy is not there

    def begin(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.old_size = self.path.stat().st_size
        try:
            self.out = open(self.tmp, "wb")  # noqa: SIM115
            self._copy_old(0, self.gap.offset)
        except OSError as exc:
            self.fail(f"cannot write {self.tmp}: {exc.strerror or exc}")

    def _copy_old(self, start: int, stop: int | None) -> None:
        try:
            old = open(self.path, "rb")  # noqa: SIM115
        except FileNotFoundError:
            return
        with old:
            old.seek(start)
            left = stop - start if stop is not None else None
            while left is None or left > 0:
                block = old.read(COPY_BLOCK if left is None else min(COPY_BLOCK, left))
                if not block:
                    break
                self.out.write(block)
                left = None if left is None else left - len(block)

    def feed(self, raw: bytes) -> None:
        if self.out is None:
            return
        self.received += len(raw)
        data = self.partial + raw
        cut = data.rfind(b"\n") + 1
        self.partial = data[cut:]
        try:
            self.out.write(self.mask(data[:cut]))  # whole lines, as the stream masks them
        except OSError as exc:
            self.fail(f"cannot write {self.tmp}: {exc.strerror or exc}")

    def finish(self, size: int) -> None:
        if self.out is None:
            return
        if size != self.received:
            self.fail(f"{self.gap.copy()}: {self.received} of {size} bytes arrived")
            return
        try:
            if self.partial:  # the rank ended without a newline: the stream adds one
                self.out.write(self.mask(self.partial + b"\n"))
            self._copy_old(self.gap.end, None)
            self.out.close()
        except OSError as exc:
            self.fail(f"cannot write {self.tmp}: {exc.strerror or exc}")
            return
        self.new_size = self.tmp.stat().st_size

    def fail(self, why: str, gone: bool = False) -> None:
        self.why = self.why or why
        self.gone = self.gone or gone
        if self.out is not None:
            with contextlib.suppress(OSError):
                self.out.close()
            self.out = None
        with contextlib.suppress(OSError):
            self.tmp.unlink()

    def install(self) -> None:
        os.replace(self.tmp, self.path)


class FetchSink(CaptureSink):
    """What FETCH_RANKS prints, into each node's Refills; any other line kept as output."""

    def __init__(self, refills: dict[int, list[Refill]]) -> None:
        super().__init__()
        self.refills = refills

    def node_output(self, node: int, data: bytes, console: bool = True) -> None:
        other = []
        for line in data.splitlines(keepends=True):
            words = line.split(b" ", 2)
            ours = len(words) == 3 and words[0] in (b"D", b"end", b"missing")
            if not (ours and words[1].isdigit() and int(words[1]) < len(self.refills[node])):
                other.append(line)  # anything else the node printed (a login script's echo)
                continue
            refill = self.refills[node][int(words[1])]
            try:
                if words[0] == b"D":
                    refill.feed(base64.b64decode(words[2].rstrip(), validate=True))
                elif words[0] == b"end":
                    refill.finish(int(words[2]))
                else:
                    why = words[2].decode(errors="replace").strip()
                    refill.fail(f"the node's copy is gone ({why})", gone=True)
            except ValueError:  # binascii.Error is one
                refill.fail(f"garbled output from {refill.gap.copy()}: {line[:80]!r}")
        if other:
            super().node_output(node, b"".join(other), console)


def fill_round(
    gaps: Sequence[Gap],
    connection_of: Callable[[Gap], NodeConnection],
    logs_dir: Path,
    mask: Callable[[bytes], bytes],
) -> list[Refill]:
    """Fetch one gap's node copy per rank file, all nodes at once, into new rank files."""
    groups: dict[int, tuple[NodeConnection, str, list[Refill]]] = {}
    refills = []
    for gap in gaps:
        refill = Refill(gap, logs_dir, mask)
        refills.append(refill)
        refill.begin()
        if refill.out is not None:
            connection = connection_of(gap)
            groups.setdefault(id(connection), (connection, gap.python, []))[2].append(refill)
    nodes = list(groups.values())
    if nodes:
        fetch_from(nodes)
    return refills


def fetch_from(nodes: list[tuple[NodeConnection, str, list[Refill]]]) -> None:
    """Run FETCH_RANKS on the nodes at once; if one cannot start it (a node lost in the
    run), on each in turn, so that the others still deliver."""
    argvs = [
        [python, "-c", FETCH_RANKS, *(a for r in group for a in (r.gap.node_dir, str(r.gap.rank)))]
        for _, python, group in nodes
    ]
    sink = FetchSink({index: node[2] for index, node in enumerate(nodes)})
    try:
        results = run_on_nodes(
            [node[0] for node in nodes],
            [node[1] for node in nodes],
            argvs,
            sink=sink,
            tag="fetch",
            what="fetching the rank files",
        )
    except Interrupted as exc:
        results = [str(exc)] * len(nodes)
    except OrchestratorError as exc:
        if len(nodes) == 1:
            results = [str(exc)]
        else:
            for node in nodes:
                fetch_from([node])
            return
    for (_, _, group), result in zip(nodes, results, strict=True):
        why = result if isinstance(result, str) else f"{result.host}: {result.describe()}"
        for refill in group:
            if refill.new_size is None:
                refill.fail(why if isinstance(result, str) else why + last_line(result))


def fill_gaps(
    gaps: Sequence[Gap],
    connection_of: Callable[[Gap], NodeConnection],
    logs_dir: Path,
    mask: Callable[[bytes], bytes] = lambda data: data,
    commit: Callable[[list[Gap]], None] = lambda open_gaps: None,
) -> tuple[list[Gap], list[Refill]]:
    """Fill every gap from its node's copy: (the gaps still open, the refills that failed).

    A rank file with several gaps (several attempts) is filled from its last gap back, so
    the offsets of those before stay true. `commit` gets the gaps still open before any
    file changes, to record them; if it raises, no file changes (and it is not called
    when none would)."""
    queues: dict[int, list[Gap]] = {}
    for gap in sorted(gaps, key=lambda g: -g.offset):
        queues.setdefault(gap.rank, []).append(gap)
    still: list[Gap] = []
    failed: list[Refill] = []
    while any(queues.values()):
        refills = fill_round(
            [q.pop(0) for q in queues.values() if q], connection_of, logs_dir, mask
        )
        done = [r for r in refills if r.new_size is not None]
        failed += [r for r in refills if r.new_size is None]
        still += [dataclasses.replace(r.gap, why=r.why) for r in refills if r.new_size is None]
        for refill in done:  # the gaps after a filled one move with its new length
            gap, grown = refill.gap, refill.new_size - refill.old_size
            still = [
                dataclasses.replace(g, offset=g.offset + grown, end=g.end + grown)
                if g.rank == gap.rank and g.offset >= gap.end
                else g
                for g in still
            ]
        if not done:
            continue
        try:
            commit(still + [g for q in queues.values() for g in q])
        except BaseException:
            for refill in done:
                refill.fail("not recorded")
            raise
        for refill in done:
            refill.install()
    return still, failed
