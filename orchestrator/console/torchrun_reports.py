"""torchrun's own reports of failures it did not cause, told from the rest of a node's output.

Every rank's output goes to its own file (the node script's run_rank), so what a node
prints is its script's and its torchrun's. When a rank fails, or the node is stopped,
torchrun tells it in its own words: a log line (`failed (exitcode: 1) local_rank: 0 ...`,
`Received 15 death signal, shutting down workers`), then a traceback of its own frames
ending in ChildFailedError (and its `====` block: `bash FAILED`, `Failures:`, `Root Cause
(first observed failure):`, `host: ...`, `To enable traceback see: ...`) or in
SignalException. The orchestrator says the same, better (which rank failed first, and
how); so the node log and combined.log keep these lines, and what is read as a console
(the attached console, a run summary's last lines, `orchestrator logs`) leaves them out.

The rule, over one node's lines in order (never a rank's: those are the program's own):

- a torch.distributed.elastic log line whose message is one of REPORTS;
- a traceback whose every frame is torchrun's (`<frozen runpy>`, `<string>` (the node
  script's orchestrator_torchrun), `.../bin/torchrun`, `.../torch/distributed/...`, or
  Python's own library below them: a second signal lands in subprocess.py's wait) and
  whose exception is torch.distributed.elastic's ChildFailedError or SignalException. It
  is held until a frame or its last line says whose it is: any other traceback (a
  frame of the user's, an error of torchrun's own such as a rendezvous timeout) is shown
  whole, in order;
- after such a traceback, Python's chaining of the next one (a blank line, `During
  handling of the above exception, another exception occurred:`, a blank line), held
  with that next traceback and judged with it;
- after such a ChildFailedError, its message: the `=`-bordered block, while its lines are
  shaped as torch writes it (a line of another shape ends it and is judged on its own).
"""

from __future__ import annotations

import re
from typing import Generic, TypeVar

T = TypeVar("T")

# torch's elastic loggers: glog style (`W1128 08:03:43.822000 31958 torch/distributed/
# elastic/agent/server/api.py:753] ...`) or logging's default (`WARNING:torch.distributed.
# elastic.agent.server.api:...`, older torch).
_ELASTIC_LOG = re.compile(
    rb"\[?[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S*torch/distributed/elastic/\S+:\d+\] "
    rb"|(?:INFO|WARNING|ERROR|CRITICAL):torch\.distributed\.elastic\.[\w.]+:"
)
# Its messages that report a worker's failure, or its own shutdown after a signal.
REPORTS = re.compile(
    rb"failed \(exitcode: -?\d+\) local_rank: "
    rb"|Received \d+ death signal"
    rb"|Got termination signal"
    rb"|Sending process \d+ closing signal"
    rb"|Closing process \d+ via signal"
    rb"|Unable to shutdown process \d+ via"
    rb"|no error file defined for parent"
)
_TRACEBACK = b"Traceback (most recent call last):"
_FRAME = re.compile(rb'  File "([^"]*)", line \d+')
_TORCHRUN_FILE = re.compile(
    rb"<frozen runpy>|<string>|.*/torchrun|.*/torch/distributed/.*"
    rb"|.*/lib/python3\.\d+/[\w.]+\.py"  # the standard library's top level (no site-packages)
)
_CHAINING = re.compile(
    rb"|During handling of the above exception, another exception occurred:"
    rb"|The above exception was the direct cause of the following exception:"
)
_CHAINING_LINES = 3  # Python writes a blank line, its words and a blank line between
_EXCEPTION = re.compile(
    rb"torch\.distributed\.elastic\.[\w.]*\.(ChildFailedError|SignalException)\b"
)
# The lines of ChildFailedError's block (errors/__init__.py's templates), but its borders.
_BLOCK_LINE = re.compile(
    rb"-+|\S.* FAILED|Failures:|Root Cause \(first observed failure\):|\[\d+\]:|\s.*|"
)
_BORDER = re.compile(rb"=+")
MAX_HELD = 1000  # a traceback this long is shown as it goes, whatever its end says

_NORMAL, _TRACEBACK_HELD, _BLOCK, _CHAINED = range(4)


def reported_line(text: bytes) -> bool:
    """Whether one line is a log line of torchrun's that reports a failure or its shutdown."""
    head = _ELASTIC_LOG.match(text)
    return head is not None and REPORTS.match(text, head.end()) is not None


class ReportFilter(Generic[T]):
    """One node's lines in, in order; those to show out. Each line comes with an item
    (the line as the caller holds it: prefixed, or with where it goes) that is handed
    back when the line is shown, at once or once its traceback is judged."""

    def __init__(self) -> None:
        self.state = _NORMAL
        self.held: list[T] = []
        self.borders = 0  # of the ChildFailedError block, while in it

    def feed(self, text: bytes, item: T) -> list[T]:
        """The items to show now: none, this one, or held ones and this one."""
        text = text.rstrip(b"\r\n")
        if self.state == _BLOCK:
            if self._in_block(text):
                return []
            self.state = _NORMAL
        if self.state == _TRACEBACK_HELD:
            return self._in_traceback(text, item)
        if self.state == _CHAINED:
            if text == _TRACEBACK:
                self.state = _TRACEBACK_HELD
                self.held.append(item)
                return []
            if _CHAINING.fullmatch(text) and len(self.held) < _CHAINING_LINES:
                self.held.append(item)
                return []
            return self.drain() + self.feed(text, item)
        if text == _TRACEBACK:
            self.state, self.held = _TRACEBACK_HELD, [item]
            return []
        return [] if reported_line(text) else [item]

    def _in_traceback(self, text: bytes, item: T) -> list[T]:
        if text[:1].isspace():
            frame = _FRAME.match(text)
            ours = frame is None or _TORCHRUN_FILE.fullmatch(frame.group(1)) is not None
            if ours and len(self.held) < MAX_HELD:
                self.held.append(item)
                return []
            return self.drain() + [item]  # a frame of someone else's: shown from here on
        exception = _EXCEPTION.match(text)
        if exception is None:
            return self.drain() + [item]
        self.held.clear()
        self.state = _BLOCK if exception.group(1) == b"ChildFailedError" else _CHAINED
        self.borders = 0
        return []

    def _in_block(self, text: bytes) -> bool:
        """Whether `text` belongs to the ChildFailedError block (which ends at its second
        border); a line before the first border must be that border."""
        if _BORDER.fullmatch(text):
            self.borders += 1
            if self.borders == 2:
                self.state = _NORMAL
            return True
        return self.borders == 1 and _BLOCK_LINE.fullmatch(text) is not None

    def pending(self) -> list[T]:
        """The items held while their traceback is judged (shown if it is not torchrun's)."""
        return list(self.held)

    def drain(self) -> list[T]:
        """Give up judging: the held items, to show (the stream ended, or turned out not
        to be torchrun's report)."""
        held, self.held = self.held, []
        if self.state in (_TRACEBACK_HELD, _CHAINED):
            self.state = _NORMAL
        return held
