"""The log stream: rank and node lines -> console (prefixed, coloured), per-rank files and a
combined file. The readers behind `orchestrator logs` are in reading.py.

Lines arrive whole (the node agent cuts them), so writing each chunk in one piece keeps
every line intact: two ranks' lines are never spliced. A file that cannot be written (its
file system is full) never stops the run or the console (orchestrator.record.logfile).

The files keep every line. torchrun's own reports of a failure it did not cause (its
ChildFailedError block, its shutdown after a signal: torchrun_reports.py) stay off the
console and out of a node's last lines, which the run's summary quotes.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from orchestrator.console.fold import ORCHESTRATOR, Folder
from orchestrator.console.footer import Footer
from orchestrator.console.torchrun_reports import ReportFilter
from orchestrator.record.logfile import LogFile, open_append

COLORS = (36, 33, 32, 35, 34, 31, 96, 93, 92, 95, 94, 91)  # ANSI foreground codes
RESET = b"\x1b[0m"
TAIL_LINES = 20


def use_color(stream: object, choice: str = "auto") -> bool:
    """--color auto|always|never; auto honours NO_COLOR and TERM=dumb."""
    if choice != "auto":
        return choice == "always"
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def prefix_lines(data: bytes, prefix: bytes) -> bytes:
    """Put `prefix` before every line of `data` (whole lines, ending with a newline)."""
    if not data:
        return b""
    return prefix + data[:-1].replace(b"\n", b"\n" + prefix) + data[-1:]


class LogSink:
    """Where every line of a run goes; one per run, used from one thread."""

    def __init__(
        self,
        logs_dir: Path | None,
        rank_labels: dict[int, str],
        node_labels: dict[int, str],
        console: BinaryIO | None,
        color: bool,
        mask: Callable[[bytes], bytes] = lambda data: data,
        opener: Callable[[Path], BinaryIO] = open_append,
        fold: bool = False,
        clock: Callable[[], float] = time.monotonic,
        footer: Footer | None = None,
    ) -> None:
        self.logs_dir = logs_dir
        self.console = console
        self.footer = footer  # a line kept under the console's stream (launch on a terminal)
        self.mask = mask
        self.rank_prefix = {r: f"[{label}] ".encode() for r, label in rank_labels.items()}
        self.node_prefix = {n: f"[{label}] ".encode() for n, label in node_labels.items()}
        self.rank_tails: dict[int, deque[bytes]] = {}
        self.node_tails: dict[int, deque[bytes]] = {}
        # each node's lines, (line, whether the console shows it), as torchrun's reports leave
        self.node_reports: dict[int, ReportFilter[tuple[bytes, bool]]] = {}
        self.color_prefix: dict[bytes, bytes] = {}
        if color:
            for index, (_, prefix) in enumerate(sorted(self.rank_prefix.items())):
                code = COLORS[index % len(COLORS)]
                self.color_prefix[prefix] = b"\x1b[%dm" % code + prefix[:-1] + RESET + b" "
            for prefix in self.node_prefix.values():
                self.color_prefix[prefix] = b"\x1b[1m" + prefix[:-1] + RESET + b" "
        self.opener = opener
        self.clock = clock
        self.folder = Folder(self._show_folded) if fold and console is not None else None
        self.files: dict[str, LogFile] = {}
        self.rank_files: dict[int, LogFile] = {}
        # The files written since the last flush, in the order they were first written (a
        # flush passes over those, not over every rank's file of a run of thousands).
        self.unflushed: dict[str, LogFile] = {}
        self.warned = False
        if logs_dir is not None:
            logs_dir.mkdir(parents=True, exist_ok=True)

    def _write(self, name: str, data: bytes, rank: int | None = None) -> None:
        if self.logs_dir is None:
            return
        handle = self.files.get(name)
        if handle is None:
            handle = self.files[name] = LogFile(self.logs_dir / name, rank is not None, self.opener)
            if rank is not None:
                self.rank_files[rank] = handle
        self.unflushed[name] = handle
        error = handle.write(data)
        if error is not None:
            self.report_fault(error, handle.path)

    def report_fault(self, error: OSError, path: Path) -> None:
        """A file of the run record could not be written: say so once, on the console."""
        if self.warned:
            return
        self.warned = True
        why = error.strerror or str(error)
        text = (
            f"warning: cannot write the run record: {why}: {path}; the job goes on, "
            "its output is kept whole on the nodes"
        )
        data = self.mask(text.encode() + b"\n")
        self._to_console(ORCHESTRATOR, data, prefix_lines(data, ORCHESTRATOR))

    def incomplete(self) -> dict[int, tuple[int, int]]:
        """Rank files that missed bytes: rank -> (its size when first opened here, its size
        now), the stretch of it that holds only part of what the rank printed since."""
        return {
            rank: (handle.start or 0, handle.size)
            for rank, handle in sorted(self.rank_files.items())
            if handle.lost
        }

    def _to_console(self, prefix: bytes, data: bytes, prefixed: bytes) -> None:
        """`prefixed` is data with `prefix`, as the combined log has it: reused unless the
        console shows a coloured prefix (one pass less over every byte). A rank's or node's
        lines go through the folder when the console folds; the orchestrator's own lines
        first show what it holds."""
        if self.console is None:
            return
        if self.folder is not None:
            if prefix == ORCHESTRATOR:
                self.folder.drain()
            else:
                self.folder.add_lines(self.clock(), prefix, data.splitlines(keepends=True))
                return
        self._write_console(prefix, data, prefixed)

    def _show_folded(self, prefix: bytes, line: bytes, folded: bool) -> None:
        if folded and self.color_prefix:
            shown = b"\x1b[1m" + prefix[:-1] + RESET + b" " + line
        else:
            shown = prefix + line
        self._write_console(prefix, line, shown)

    def _write_console(self, prefix: bytes, data: bytes, prefixed: bytes) -> None:
        if self.console is None:
            return
        shown = self.color_prefix.get(prefix, prefix)
        if self.footer is not None:
            self.footer.before_write()
        try:
            self.console.write(prefixed if shown == prefix else prefix_lines(data, shown))
        except (BrokenPipeError, ValueError, OSError):
            self.console = None  # the reader went away (e.g. `| head`); the files go on

    def rank_output(self, rank: int, data: bytes) -> None:
        """Whole lines printed by a rank."""
        data = self.mask(data)
        self._write(f"rank-{rank}.log", data, rank)
        prefix = self.rank_prefix[rank]
        prefixed = prefix_lines(data, prefix)
        self._write("combined.log", prefixed)
        self._to_console(prefix, data, prefixed)
        tail = self.rank_tails.setdefault(rank, deque(maxlen=TAIL_LINES))
        tail.extend(data.rsplit(b"\n", TAIL_LINES + 1)[-TAIL_LINES - 1 : -1])

    def node_output(self, node: int, data: bytes, console: bool = True) -> None:
        """Whole lines printed by a node's script or torchrun itself (not by a rank);
        `console=False`: into the files only (torchrun's shutdown after our own stop).
        torchrun's reports go into the files only, too (torchrun_reports.py)."""
        data = self.mask(data)
        self._write(f"node-{node}.log", data)
        self._write("combined.log", prefix_lines(data, self.node_prefix[node]))
        reports = self.node_reports.setdefault(node, ReportFilter())
        shown = []
        for line in data.splitlines(keepends=True):
            shown += reports.feed(line, (line, console))
        self._show_node(node, shown)

    def _show_node(self, node: int, lines: list[tuple[bytes, bool]]) -> None:
        """A node's lines that are not torchrun's reports: into its last lines, and those
        for the console onto it."""
        if not lines:
            return
        self.node_tails.setdefault(node, deque(maxlen=TAIL_LINES)).extend(
            line.rstrip(b"\n") for line, _ in lines
        )
        data = b"".join(line for line, console in lines if console)
        if data:
            prefix = self.node_prefix[node]
            self._to_console(prefix, data, prefix_lines(data, prefix))

    def _release_nodes(self) -> None:
        """Show what waits to be told from torchrun's reports: the stream is over."""
        for node, reports in self.node_reports.items():
            self._show_node(node, reports.drain())

    def note(self, text: str) -> None:
        """A line from the orchestrator itself, into the combined log and the console."""
        data = self.mask(text.rstrip("\n").encode() + b"\n")
        prefix = ORCHESTRATOR
        prefixed = prefix_lines(data, prefix)
        self._write("combined.log", prefixed)
        self._to_console(prefix, data, prefixed)

    def node_note(self, host: str, text: str) -> None:
        """A line of ours about one node (`HOST: text`): a note, which the console folds
        across nodes saying the same (`[orchestrator] ceon[1-16]: stopping ...`)."""
        if self.folder is None:
            self.note(f"{host}: {text}")
            return
        data = self.mask(f"{host}: {text.rstrip()}\n".encode())
        self._write("combined.log", ORCHESTRATOR + data)
        about = f"{host}: ".encode()
        if data.startswith(about):
            self.folder.add(self.clock(), ORCHESTRATOR + about, data[len(about) :], about=host)
        else:  # the mask took part of the host name: the line as it is
            self._to_console(ORCHESTRATOR, data, ORCHESTRATOR + data)

    def last_lines(self, rank: int | None = None, node: int | None = None) -> list[str]:
        """A rank's or node's last TAIL_LINES lines, as the console has them."""
        if rank is not None:
            tails = list(self.rank_tails.get(rank) or ())
        else:
            tails = list(self.node_tails.get(node) or ())
            waiting = self.node_reports.get(node)  # lines held until their end is known
            tails += [line.rstrip(b"\n") for line, _ in waiting.pending()] if waiting else []
        return [line.decode(errors="replace") for line in tails[-TAIL_LINES:]]

    def flush(self, drain: bool = False) -> None:
        """Write what waits; the folder shows the lines whose wait is over (all: `drain`)."""
        if drain:
            self._release_nodes()
        if self.folder is not None:
            if drain:
                self.folder.drain()
            else:
                self.folder.release(self.clock())
        due, self.unflushed = self.unflushed, {}
        for name, handle in due.items():
            error = handle.flush()
            if error is not None:
                self.report_fault(error, handle.path)
            if handle.waiting():  # a failed write's retry, when RETRY_S is over
                self.unflushed[name] = handle
        if self.console is not None:
            if self.footer is not None:
                self.footer.after_write()
            try:
                self.console.flush()
            except (BrokenPipeError, ValueError, OSError):
                self.console = None

    def holding(self) -> bool:
        """Whether the console holds lines back (to fold them) that a later flush shows."""
        return self.folder is not None and self.folder.holding()

    def update_footer(self, make_text: Callable[[], str]) -> None:
        """The footer's text made again when due (see orchestrator.console.footer); shown at the
        next flush."""
        if self.footer is not None and self.console is not None:
            self.footer.update(make_text)

    def end_footer(self) -> None:
        """No footer from now on (the run is over; its closing lines follow)."""
        if self.footer is not None:
            self.footer.end()

    def close(self) -> None:
        """Write what waits and close the files; a later line opens them again."""
        self.flush(drain=True)
        for handle in self.files.values():
            error = handle.close()
            if error is not None:
                self.report_fault(error, handle.path)
