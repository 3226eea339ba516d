"""Folding the console (orchestrator.console.fold, LogSink(fold=True), logs.fold_lines): identical
lines from many ranks or nodes show once with their host and rank lists, a differing one
stands alone, no distinct line waits longer than the window, each rank's lines keep their
order, and the files keep every line."""

from __future__ import annotations

import io
import re
from pathlib import Path

from orchestrator.console.fold import LONGEST_S, QUIET_S, WINDOW_S, Folder
from orchestrator.console.reading import fold_lines
from orchestrator.console.sink import LogSink
from orchestrator.hostlist import expand_range


class Console:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.folded: list[bool] = []

    def __call__(self, prefix: bytes, text: bytes, folded: bool) -> None:
        self.lines.append((prefix + text).decode().rstrip("\n"))
        self.folded.append(folded)


def rank(n: int, per_node: int = 1) -> bytes:
    return f"[ceon{n // per_node + 1} r{n}] ".encode()


def test_identical_lines_from_many_ranks_fold_into_one_with_their_host_and_rank_lists() -> None:
    shown = Console()
    folder = Folder(shown)
    for n in range(128):  # 64 nodes, 2 ranks each, all within the window
        folder.add(n * 0.001, rank(n, per_node=2), b"python 3.11.7, torch 2.13.0\n")
    folder.release(1.0)
    assert shown.lines == ["[ceon[1-64] r[0-127]] python 3.11.7, torch 2.13.0"]
    assert shown.folded == [True]


def test_node_lines_fold_by_host_and_a_differing_node_stands_on_its_own_line() -> None:
    shown = Console()
    folder = Folder(shown)
    for n in range(1, 17):
        text = b"torch 2.12.0\n" if n == 7 else b"torch 2.13.0\n"
        folder.add(0.0, f"[node{n:02d}] ".encode(), text)
    folder.drain()
    assert shown.lines == ["[node[01-06,08-16]] torch 2.13.0", "[node07] torch 2.12.0"]
    assert shown.folded == [True, False]


def test_a_line_nobody_repeats_is_shown_as_printed() -> None:
    shown = Console()
    folder = Folder(shown)
    folder.add(0.0, b"[ceon1 r0] ", b"step 10 loss 0.25\n")
    folder.add(0.0, b"[ceon2 r1] ", b"step 10 loss 0.31\n")
    folder.drain()
    assert shown.lines == ["[ceon1 r0] step 10 loss 0.25", "[ceon2 r1] step 10 loss 0.31"]
    assert shown.folded == [False, False]


def test_a_distinct_line_is_never_held_longer_than_the_window() -> None:
    shown = Console()
    folder = Folder(shown)
    # a steady stream of copies from other ranks must not hold the distinct line back
    folder.add(0.0, rank(0), b"same\n")
    folder.add(0.05, rank(9), b"only rank 9 says this\n")
    for step in range(1, 60):
        now = 0.05 + step * 0.01
        folder.add(now, rank(step % 8), b"same\n")
        folder.release(now)
        if now - 0.05 < WINDOW_S:
            assert "[ceon10 r9] only rank 9 says this" not in shown.lines
        if now - 0.05 >= WINDOW_S:
            assert "[ceon10 r9] only rank 9 says this" in shown.lines
            break
    else:
        raise AssertionError("the window never passed")


def test_copies_that_come_late_fold_into_one_more_line_once_they_stop() -> None:
    shown = Console()
    folder = Folder(shown)
    for n in range(8):
        folder.add(0.0, rank(n), b"hello\n")
    folder.release(WINDOW_S)
    assert shown.lines == ["[ceon[1-8] r[0-7]] hello"]
    # ranks 8-99 start later, one every 20 ms (1.8 s in all): one more line, not 92
    now = 1.0
    for n in range(8, 100):
        now = 1.0 + (n - 8) * 0.02
        folder.add(now, rank(n), b"hello\n")
        folder.release(now)
    assert len(shown.lines) == 1  # still coming: held
    folder.release(now + QUIET_S)
    assert shown.lines == ["[ceon[1-8] r[0-7]] hello", "[ceon[9-100] r[8-99]] hello"]


def test_late_copies_that_keep_coming_show_every_longest_wait() -> None:
    shown = Console()
    folder = Folder(shown)
    folder.add(0.0, rank(0), b"hello\n")
    folder.release(WINDOW_S)
    n, now = 1, 1.0
    while now < 1.0 + 2 * LONGEST_S:  # a copy every 0.5 s for 10 s
        folder.add(now, rank(n), b"hello\n")
        folder.release(now)
        n, now = n + 1, now + 0.5
    folder.drain()
    assert 3 <= len(shown.lines) <= 4
    covered = [r for line in shown.lines for r in ranks_of(line)]
    assert covered == list(range(n))


def test_copies_that_trickle_in_for_minutes_show_a_handful_of_times() -> None:
    # Seen at 256 nodes: each node's torch printed the same warning once, over three
    # minutes, with gaps of up to 16 s; at a fixed wait the console showed it 31 times.
    shown = Console()
    folder = Folder(shown)
    now, gaps = 0.0, [0.3, 2.5, 0.1, 7.0, 1.2, 16.0, 0.6, 3.3]
    for n in range(256):
        folder.release(now)
        folder.add(
            now, rank(n), b"[W1127 00:10:%06.3f socket.cpp:207] [c10d] warning\n" % (now % 60)
        )
        now += gaps[n % len(gaps)] / 5
    folder.release(now + 200)
    covered = [r for line in shown.lines for r in ranks_of(line)]
    assert sorted(covered) == list(range(256))
    assert {text_of(line)[20:] for line in shown.lines} == {"socket.cpp:207] [c10d] warning"}
    assert len(shown.lines) <= 8, (now, len(shown.lines))


def ranks_of(line: str) -> list[int]:
    match = re.match(r"\[\S+ (r\S+)\] ", line)
    assert match, line
    return [int(name[1:]) for name in expand_range(match.group(1))]


def text_of(line: str) -> str:
    return re.sub(r"^\[\S+ r\S+\] ", "", line)


def test_each_rank_keeps_its_own_order_on_the_console() -> None:
    shown = Console()
    folder = Folder(shown)
    # rank 0 prints A then B; rank 1 prints B then A; then rank 0 prints A again
    folder.add(0.0, rank(0), b"A\n")
    folder.add(0.0, rank(0), b"B\n")
    folder.add(0.1, rank(1), b"B\n")
    folder.add(0.1, rank(1), b"A\n")
    folder.add(0.2, rank(0), b"A\n")
    folder.drain()
    seen: dict[int, list[str]] = {0: [], 1: []}
    for line in shown.lines:
        for r in ranks_of(line):
            seen[r].append(text_of(line))
    assert seen == {0: ["A", "B", "A"], 1: ["B", "A"]}


def test_the_same_rank_printing_a_line_twice_shows_it_twice() -> None:
    shown = Console()
    folder = Folder(shown)
    folder.add(0.0, rank(0), b"waiting\n")
    folder.add(0.01, rank(0), b"waiting\n")
    folder.drain()
    assert shown.lines == ["[ceon1 r0] waiting", "[ceon1 r0] waiting"]


def test_the_sink_folds_the_console_only_and_the_files_keep_every_line(tmp_path: Path) -> None:
    clock = [0.0]
    console = io.BytesIO()
    labels = {r: f"ceon{r + 1} r{r}" for r in range(4)}
    sink = LogSink(tmp_path, labels, {}, console, False, fold=True, clock=lambda: clock[0])
    for r in range(4):
        sink.rank_output(r, b"loading data\n")
    sink.rank_output(2, b"rank 2 has its own line\n")
    sink.flush()
    assert console.getvalue() == b""  # held for the window
    clock[0] = WINDOW_S
    sink.flush()
    sink.note("run succeeded")
    sink.close()
    assert console.getvalue().decode().splitlines() == [
        "[ceon[1-4] r[0-3]] loading data",
        "[ceon3 r2] rank 2 has its own line",
        "[orchestrator] run succeeded",
    ]
    assert (tmp_path / "rank-2.log").read_text() == "loading data\nrank 2 has its own line\n"
    for r in (0, 1, 3):
        assert (tmp_path / f"rank-{r}.log").read_text() == "loading data\n"
    combined = (tmp_path / "combined.log").read_text().splitlines()
    assert [line for line in combined if "loading data" in line] == [
        f"[ceon{r + 1} r{r}] loading data" for r in range(4)
    ]


def test_an_orchestrator_line_shows_what_is_held_first() -> None:
    console = io.BytesIO()
    sink = LogSink(None, {0: "a r0", 1: "b r1"}, {}, console, False, fold=True)
    sink.rank_output(0, b"x\n")
    sink.rank_output(1, b"x\n")
    sink.note("node b: lost")
    assert console.getvalue().decode().splitlines() == [
        "[a,b r[0-1]] x",
        "[orchestrator] node b: lost",
    ]


def test_without_folding_every_line_shows_as_printed() -> None:
    console = io.BytesIO()
    sink = LogSink(None, {0: "a r0", 1: "b r1"}, {}, console, False, fold=False)
    sink.rank_output(0, b"x\n")
    sink.rank_output(1, b"x\n")
    assert console.getvalue().decode().splitlines() == ["[a r0] x", "[b r1] x"]


def test_a_folded_prefix_is_bold_when_the_console_has_colour() -> None:
    console = io.BytesIO()
    sink = LogSink(None, {0: "a r0", 1: "b r1"}, {}, console, True, fold=True)
    sink.rank_output(0, b"x\n")
    sink.rank_output(1, b"x\n")
    sink.close()
    assert console.getvalue() == b"\x1b[1m[a,b r[0-1]]\x1b[0m x\n"


def test_a_log_read_back_folds_the_same_way() -> None:
    combined = [
        b"[orchestrator] run r1 started\n",
        *(f"[ceon{n} r{n - 1}] hello\n".encode() for n in range(1, 33)),
        b"[ceon3 r2] rank 2 alone\n",
        b"[ceon1] torchrun says\n",
        b"[ceon2] torchrun says\n",
        b"[orchestrator] run r1 succeeded\n",
    ]
    assert list(fold_lines(combined)) == [
        b"[orchestrator] run r1 started\n",
        b"[ceon[1-32] r[0-31]] hello\n",
        b"[ceon3 r2] rank 2 alone\n",
        b"[ceon[1-2]] torchrun says\n",
        b"[orchestrator] run r1 succeeded\n",
    ]


def test_our_notes_about_nodes_fold_across_the_nodes_that_say_the_same(tmp_path: Path) -> None:
    console = io.BytesIO()
    nodes = {k: f"ceon{k + 1}" for k in range(16)}
    sink = LogSink(tmp_path, {}, nodes, console, False, fold=True)
    for host in nodes.values():
        sink.node_note(host, "stopping (stop requested)")
    sink.node_note("ceon4", "rank 3 ignored SIGTERM: killed")
    sink.close()
    assert console.getvalue().decode().splitlines() == [
        "[orchestrator] ceon[1-16]: stopping (stop requested)",
        "[orchestrator] ceon4: rank 3 ignored SIGTERM: killed",
    ]
    combined = (tmp_path / "combined.log").read_bytes()
    assert combined.count(b": stopping (stop requested)\n") == 16  # the record keeps each
    assert list(fold_lines(combined.splitlines(keepends=True))) == [
        b"[orchestrator] ceon[1-16]: stopping (stop requested)\n",
        b"[orchestrator] ceon4: rank 3 ignored SIGTERM: killed\n",
    ]


def test_lines_that_differ_only_in_a_leading_time_stamp_fold_showing_the_first() -> None:
    shown = Console()
    folder = Folder(shown)
    warning = "socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved."
    for n, stamp in enumerate(["13:34:54.336425368", "13:34:54.363554339", "13:34:54.429955"]):
        folder.add(0.0, f"[ceon{n + 1}] ".encode(), f"[W1125 {stamp} {warning}\n".encode())
    for n in range(2):
        folder.add(0.0, rank(n), f"2026-11-25 13:34:5{n},12{n} INFO epoch 1 done\n".encode())
    folder.add(0.0, rank(2), b"2026-11-25 13:34:52,120 INFO epoch 2 done\n")
    folder.drain()
    assert shown.lines == [
        f"[ceon[1-3]] [W1125 13:34:54.336425368 {warning}",
        "[ceon[1-2] r[0-1]] 2026-11-25 13:34:50,120 INFO epoch 1 done",
        "[ceon3 r2] 2026-11-25 13:34:52,120 INFO epoch 2 done",
    ]
