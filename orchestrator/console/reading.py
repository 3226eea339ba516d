"""Reading logs back, for `orchestrator logs` and a run's summary: the last lines of a file,
a growing file followed line by line, the combined log as a console shows it (folded, and
without torchrun's own reports: torchrun_reports.py), and the --grep/--node filter."""

from __future__ import annotations

import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from orchestrator.console.fold import ORCHESTRATOR, Folder, split_prefix
from orchestrator.console.torchrun_reports import ReportFilter


def last_lines_of(
    path: Path, count: int, end: int | None = None, keep: Callable[[bytes], bool] | None = None
) -> list[bytes]:
    """The last `count` lines of a file (before byte `end`) that `keep` accepts.

    Without `keep`, only the end of the file is read.
    """
    if count <= 0 or not path.exists():
        return []
    if keep is not None:
        kept: deque[bytes] = deque(maxlen=count)
        with open(path, "rb") as handle:
            data = handle.read(end) if end is not None else handle.read()
        kept.extend(line + b"\n" for line in data.split(b"\n")[:-1] if keep(line + b"\n"))
        return list(kept)
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell() if end is None else min(end, handle.tell())
        block, data = 1 << 16, b""
        while size > 0 and data.count(b"\n") <= count:
            step = min(block, size)
            size -= step
            handle.seek(size)
            data = handle.read(step) + data
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [line + b"\n" for line in lines[-count:]]


def follow(
    path: Path,
    is_done: Callable[[], bool],
    from_start: bool = True,
    poll_s: float = 0.2,
    offset: int | None = None,
    idle: bool = False,
) -> Iterator[bytes]:
    """Yield whole lines of a growing file until `is_done()` and nothing more arrives.

    Starts at byte `offset` when given, else at the start or (from_start=False) the end.
    `idle`: yield b"" each time it finds nothing new, before it waits.
    """
    if offset is None:
        offset = 0 if from_start else (path.stat().st_size if path.exists() else 0)
    partial = b""
    while True:
        done = is_done()  # read before the file, so no line written before `done` is lost
        data = b""
        if path.exists():
            with open(path, "rb") as handle:
                handle.seek(offset)
                data = handle.read()
            offset += len(data)
        if data:
            data = partial + data
            cut = data.rfind(b"\n") + 1
            partial = data[cut:]
            yield from (line + b"\n" for line in data[:cut].split(b"\n")[:-1])
        elif done:
            if partial:
                yield partial + b"\n"
            return
        else:
            if idle:
                yield b""
            time.sleep(poll_s)


NOTE_ABOUT = re.compile(rb"(\S+?): ")  # `[orchestrator] ceon3: stopping ...`: a note about ceon3

# A log read back whole has no times: its fold windows count lines instead of seconds.
LINE_WINDOWS = {"window": 1000, "quiet": 1000, "longest": 5000, "recent": 10000}


def fold_lines(lines: Iterable[bytes], clock: Callable[[], float] | None = None) -> Iterator[bytes]:
    """Combined-log lines folded as the console folds them (orchestrator.console.fold). With
    `clock` (a log followed live) the windows are seconds and b"" items are ticks of
    it; without, they count lines. The orchestrator's own lines pass as they are, but
    for those about one host (`[orchestrator] HOST: ...`), folded across hosts."""
    shown: list[bytes] = []
    folder = Folder(
        lambda prefix, text, folded: shown.append(prefix + text),
        **({} if clock is not None else LINE_WINDOWS),
    )
    for count, line in enumerate(lines):
        now = clock() if clock is not None else float(count)
        if line:
            parts = split_prefix(line)
            about = NOTE_ABOUT.match(line, len(ORCHESTRATOR)) if parts else None
            if parts is not None and parts[0] == ORCHESTRATOR and about is not None:
                prefix = line[: about.end()]
                folder.add(now, prefix, line[about.end() :], about=about.group(1).decode())
            elif parts is None or parts[0] == ORCHESTRATOR:
                folder.drain()
                shown.append(line)
            else:
                folder.add(now, *parts)
        folder.release(now)
        yield from shown
        shown.clear()
    folder.drain()
    yield from shown


NODE_LINE = re.compile(rb"\[[^\]\s]+\] ")  # `[ceon3] `; a rank's is `[ceon3 r12] `
REPORT_MARGIN = 200  # lines read before a --tail's, so a report it cuts is still told


class NodeReports:
    """Combined-log lines in, in order; those a console shows out: each node's torchrun
    reports left out, as the attached console leaves them (orchestrator.console.sink).
    Ranks' and the orchestrator's lines, and b"" (a tick of a followed log), pass."""

    def __init__(self) -> None:
        self.nodes: dict[bytes, ReportFilter[bytes]] = {}

    def feed(self, line: bytes) -> list[bytes]:
        prefix = NODE_LINE.match(line)
        if prefix is None or line.startswith(ORCHESTRATOR):
            return [line]
        reports = self.nodes.setdefault(prefix.group(), ReportFilter())
        return reports.feed(line[prefix.end() :], line)

    def lines(self, lines: Iterable[bytes]) -> Iterator[bytes]:
        """`lines` as a console shows them; what waits at their end is shown then."""
        for line in lines:
            yield from self.feed(line)
        for reports in self.nodes.values():
            yield from reports.drain()

    def tail(
        self, path: Path, count: int, end: int, keep: Callable[[bytes], bool] | None
    ) -> list[bytes]:
        """The last `count` lines a console shows of the combined log before byte `end`
        that `keep` accepts; what follows is to be fed on from `end`."""
        if keep is None:  # only the end is read: enough before it to tell a report cut there
            window = last_lines_of(path, count + REPORT_MARGIN, end=end)
        else:  # every line up to `end` (no more than end + 1 of them)
            window = last_lines_of(path, end + 1, end=end, keep=lambda line: True)
        shown = (line for found in window for line in self.feed(found))
        return list(deque((line for line in shown if keep is None or keep(line)), count))


def line_filter(grep: str | None, node: str | None) -> Callable[[bytes], bool]:
    """A predicate for combined-log lines: --grep REGEX and --node HOST."""
    pattern = re.compile(grep.encode()) if grep else None
    node_prefix = f"[{node} ".encode() if node else None
    node_line = f"[{node}]".encode() if node else None

    def keep(line: bytes) -> bool:
        if node_prefix is not None and not (
            line.startswith(node_prefix) or line.startswith(node_line)
        ):
            return False
        return pattern is None or pattern.search(line) is not None

    return keep
