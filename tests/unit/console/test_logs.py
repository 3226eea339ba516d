"""The log stream: per-rank, per-node and combined files, console prefixes, masking, tails;
and the readers behind `orchestrator logs` (last lines, follow, filter)."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.console.reading import follow, last_lines_of, line_filter
from orchestrator.console.sink import TAIL_LINES, LogSink, prefix_lines, use_color

LINES = st.lists(st.binary(max_size=20).map(lambda b: b.replace(b"\n", b"")), max_size=30)


def make_sink(tmp_path: Path, console=None, color=False, mask=lambda d: d) -> LogSink:
    return LogSink(
        tmp_path / "logs",
        {0: "a r0", 1: "a r1", 2: "b r2"},
        {0: "a", 1: "b"},
        console,
        color,
        mask=mask,
    )


def test_files_and_console_carry_attributed_lines(tmp_path) -> None:
    console = io.BytesIO()
    sink = make_sink(tmp_path, console)
    sink.rank_output(0, b"hello\nworld\n")
    sink.rank_output(2, b"from b\n")
    sink.node_output(1, b"torchrun says\n")
    sink.note("starting")
    sink.rank_output(0, b"again\n")
    sink.close()
    logs = tmp_path / "logs"
    assert (logs / "rank-0.log").read_bytes() == b"hello\nworld\nagain\n"
    assert (logs / "rank-2.log").read_bytes() == b"from b\n"
    assert not (logs / "rank-1.log").exists()
    assert (logs / "node-1.log").read_bytes() == b"torchrun says\n"
    combined = (
        b"[a r0] hello\n[a r0] world\n[b r2] from b\n[b] torchrun says\n"
        b"[orchestrator] starting\n[a r0] again\n"
    )
    assert (logs / "combined.log").read_bytes() == combined
    assert console.getvalue() == combined


def test_color_only_on_the_console(tmp_path) -> None:
    console = io.BytesIO()
    sink = make_sink(tmp_path, console, color=True)
    sink.rank_output(1, b"x\n")
    sink.node_output(0, b"y\n")
    sink.close()
    assert console.getvalue() == b"\x1b[33m[a r1]\x1b[0m x\n\x1b[1m[a]\x1b[0m y\n"
    assert (tmp_path / "logs" / "combined.log").read_bytes() == b"[a r1] x\n[a] y\n"


def test_mask_applies_to_files_console_and_tails(tmp_path) -> None:
    console = io.BytesIO()
    sink = make_sink(tmp_path, console, mask=lambda d: d.replace(b"hunter2", b"***"))
    sink.rank_output(0, b"password is hunter2\n")
    sink.note("token hunter2 seen")
    sink.close()
    for path in (tmp_path / "logs").iterdir():
        assert b"hunter2" not in path.read_bytes(), path
    assert b"hunter2" not in console.getvalue() and b"***" in console.getvalue()
    assert sink.last_lines(rank=0) == ["password is ***"]


def test_last_lines_keep_the_tail_per_rank_and_node(tmp_path) -> None:
    sink = make_sink(tmp_path)
    for i in range(TAIL_LINES + 5):
        sink.rank_output(1, f"line {i}\n".encode())
    sink.rank_output(2, b"one\ntwo\n")
    sink.node_output(0, b"n1\nn2\n")
    assert sink.last_lines(rank=1) == [f"line {i}" for i in range(5, TAIL_LINES + 5)]
    assert sink.last_lines(rank=2) == ["one", "two"]
    assert sink.last_lines(node=0) == ["n1", "n2"]
    assert sink.last_lines(rank=0) == [] and sink.last_lines(node=1) == []
    sink.close()


class BrokenConsole(io.BytesIO):
    def write(self, data) -> int:
        raise BrokenPipeError


def test_a_closed_console_does_not_stop_the_files(tmp_path) -> None:
    sink = make_sink(tmp_path, BrokenConsole())
    sink.rank_output(0, b"first\n")
    assert sink.console is None
    sink.rank_output(0, b"second\n")
    sink.flush()
    sink.close()
    assert (tmp_path / "logs" / "rank-0.log").read_bytes() == b"first\nsecond\n"


def test_quiet_node_output_goes_to_the_files_only(tmp_path) -> None:
    """torchrun's shutdown after our own stop: the node's log keeps it, the console not."""
    console = io.BytesIO()
    sink = make_sink(tmp_path, console)
    sink.node_output(0, b"torchrun starts\n")
    sink.node_output(0, b"Traceback (most recent call last):\n", console=False)
    sink.close()
    logs = tmp_path / "logs"
    assert (logs / "node-0.log").read_bytes() == (
        b"torchrun starts\nTraceback (most recent call last):\n"
    )
    assert b"[a] Traceback" in (logs / "combined.log").read_bytes()
    assert console.getvalue() == b"[a] torchrun starts\n"
    assert sink.last_lines(node=0)[-1].startswith("Traceback")


class HungUpConsole:
    """A terminal that went away: every write fails with EIO."""

    def write(self, data: bytes) -> int:
        raise OSError(5, "Input/output error")

    def flush(self) -> None:
        raise OSError(5, "Input/output error")


def test_a_hung_up_terminal_does_not_stop_the_files(tmp_path) -> None:
    sink = make_sink(tmp_path, HungUpConsole())
    sink.note("run starts")
    assert sink.console is None
    sink.rank_output(1, b"still here\n")
    sink.close()
    assert (tmp_path / "logs" / "rank-1.log").read_bytes() == b"still here\n"


def test_sink_without_files_writes_the_console_only(tmp_path) -> None:
    console = io.BytesIO()
    sink = LogSink(None, {0: "h r0"}, {0: "h"}, console, False)
    sink.rank_output(0, b"x\n")
    sink.close()
    assert console.getvalue() == b"[h r0] x\n" and not list(tmp_path.iterdir())


@settings(max_examples=100, deadline=None)
@given(LINES, st.binary(min_size=1, max_size=8).map(lambda b: b.replace(b"\n", b"")))
def test_prefix_lines_prefixes_every_line_and_nothing_else(lines, prefix) -> None:
    data = b"".join(line + b"\n" for line in lines)
    out = prefix_lines(data, prefix)
    assert out.split(b"\n")[:-1] == [prefix + line for line in lines]
    assert out.count(b"\n") == data.count(b"\n")


def test_prefix_lines_edge_cases() -> None:
    assert prefix_lines(b"", b"P ") == b""
    assert prefix_lines(b"\n\n", b"P ") == b"P \nP \n"
    assert prefix_lines(b"no newline", b"P ") == b"P no newline"


# --- readers -----------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(LINES, st.integers(0, 40), st.booleans())
def test_last_lines_of_matches_a_full_read(tmp_path_factory, lines, count, newline) -> None:
    path = tmp_path_factory.mktemp("tail") / "f.log"
    data = b"\n".join(lines) + (b"\n" if newline and lines else b"")
    path.write_bytes(data)
    whole = data.split(b"\n")
    if whole and whole[-1] == b"":
        whole.pop()
    expected = [line + b"\n" for line in whole][-count:] if count else []
    assert last_lines_of(path, count) == expected


def test_last_lines_of_a_large_file_reads_across_blocks(tmp_path) -> None:
    path = tmp_path / "big.log"
    lines = [f"{i:06d} {'x' * (i % 300)}\n".encode() for i in range(3000)]
    path.write_bytes(b"".join(lines))
    assert path.stat().st_size > 3 * (1 << 16)
    assert last_lines_of(path, 1000) == lines[-1000:]
    assert last_lines_of(path, 5000) == lines
    assert last_lines_of(tmp_path / "missing.log", 3) == []


def test_follow_yields_whole_lines_until_done(tmp_path) -> None:
    path = tmp_path / "combined.log"
    done = threading.Event()

    def writer() -> None:
        with open(path, "ab") as handle:
            for part in (b"one\ntw", b"o\n", b"three\nlast without newline"):
                handle.write(part)
                handle.flush()
                time.sleep(0.03)
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    got = list(follow(path, done.is_set, poll_s=0.01))
    thread.join()
    assert got == [b"one\n", b"two\n", b"three\n", b"last without newline\n"]


def test_follow_from_the_end_skips_old_lines(tmp_path) -> None:
    path = tmp_path / "combined.log"
    path.write_bytes(b"old\n")
    calls = []

    def is_done() -> bool:  # the first check happens once following has begun
        calls.append(1)
        if len(calls) == 1:
            with open(path, "ab") as handle:
                handle.write(b"new\n")
        return len(calls) > 1

    assert list(follow(path, is_done, from_start=False, poll_s=0.01)) == [b"new\n"]


def test_follow_of_a_missing_file_ends_when_done(tmp_path) -> None:
    assert list(follow(tmp_path / "none.log", lambda: True)) == []


@pytest.mark.parametrize(
    ("grep", "node", "kept"),
    [
        (None, None, [0, 1, 2, 3, 4]),
        ("loss", None, [0, 2]),
        (None, "a", [0, 1, 3]),
        (None, "ab", [2]),
        ("loss", "a", [0]),
        (r"^\[orchestrator\]", None, [4]),
    ],
)
def test_line_filter(grep, node, kept) -> None:
    lines = [
        b"[a r0] loss 1\n",
        b"[a r1] ok\n",
        b"[ab r2] loss 2\n",
        b"[a] torchrun\n",
        b"[orchestrator] run 1 started\n",
    ]
    keep = line_filter(grep, node)
    assert [i for i, line in enumerate(lines) if keep(line)] == kept


def test_use_color(monkeypatch) -> None:
    class Tty(io.BytesIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert use_color(Tty()) and not use_color(io.BytesIO())
    assert use_color(io.BytesIO(), "always") and not use_color(Tty(), "never")
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_color(Tty())
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert not use_color(Tty())
