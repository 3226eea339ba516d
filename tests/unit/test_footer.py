"""launch's footer: one summary line kept under the stream on a terminal, never mixed into
a log line, made at most once a second, cut to the terminal's width, gone before the
closing lines; none in a pipe or with --no-footer. The launch on a real terminal is
tests/local/test_footer_launch.py."""

from __future__ import annotations

import io
import re

from orchestrator.console.footer import PREFIX, Footer
from orchestrator.console.progress import CLEAR
from orchestrator.console.rank_table import summary
from orchestrator.console.sink import LogSink


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


COLOUR = re.compile(rb"\x1b\[[0-9;]*m")


def shown(raw: bytes) -> list[str]:
    """What a terminal shows: each line as its last redraw left it, without colours."""
    raw = COLOUR.sub(b"", raw.replace(b"\r\n", b"\n"))
    return [line.split(CLEAR)[-1].decode(errors="replace") for line in raw.split(b"\n")]


def test_the_footer_stays_under_the_lines_and_is_made_at_most_once_a_second() -> None:
    console, clock = io.BytesIO(), Clock()
    footer = Footer(console, clock, width=60)
    sink = LogSink(None, {0: "n0 r0"}, {0: "n0"}, console, False, footer=footer)
    made = []

    def text() -> str:
        made.append(clock.now)
        return f"running, step {len(made)}"

    sink.update_footer(text)
    sink.flush()
    assert console.getvalue() == CLEAR + f"{PREFIX}running, step 1".encode()
    sink.rank_output(0, b"one\ntwo\n")
    sink.update_footer(text)  # not due yet: the same text, drawn again after the lines
    sink.flush()
    clock.now += 1.0
    sink.update_footer(text)
    sink.flush()
    assert made == [100.0, 101.0]
    raw = console.getvalue()
    assert shown(raw) == ["[n0 r0] one", "[n0 r0] two", f"{PREFIX}running, step 2"]
    # The lines were written after the footer was taken away, never into it.
    assert CLEAR + b"[n0 r0] one\n" in raw
    sink.end_footer()
    sink.note("run x succeeded")
    sink.update_footer(text)
    sink.flush()
    assert shown(console.getvalue())[-2:] == ["[orchestrator] run x succeeded", ""]
    assert made == [100.0, 101.0]


def test_the_footer_is_cut_to_the_terminal_width() -> None:
    console = io.BytesIO()
    footer = Footer(console, Clock(), width=30)
    footer.update(lambda: "x" * 100)
    line = shown(console.getvalue())[-1]
    assert len(line) < 30 and line.endswith("...") and line.startswith(PREFIX)


def test_no_footer_but_on_a_terminal() -> None:
    assert Footer.on(io.BytesIO()) is None
    assert Footer.on(None) is None


def test_the_summary_says_states_step_rate_and_stragglers() -> None:
    status = {
        "state": "running",
        "ranks": [
            {"rank": 0, "host": "a", "state": "running"},
            {"rank": 1, "host": "b", "state": "running"},
            {"rank": 2, "host": "b", "state": "failed"},
        ],
        "stragglers": [{"rank": 1, "why": "work"}],
    }
    metrics = {
        0: (1.0, {"step": 120, "samples_per_s": 1000.0}),
        1: (1.0, {"step": 118, "samples_per_s": 500.5}),
    }
    assert summary(status, metrics) == (
        "running, 3 rank(s) on 2 node(s) (1 failed, 2 running), step 118, "
        "1,500 samples/s, 1 straggler(s) (rank 1)"
    )
    assert summary({"state": "starting"}, {}) == "starting, 0 rank(s) on 0 node(s) ()"
