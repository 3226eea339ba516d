"""torchrun's own failure and shutdown reports, told from everything else a node prints
(orchestrator/console/torchrun_reports.py), and kept off what is read as a console: the
attached console and a node's last lines (LogSink), and `orchestrator logs` (NodeReports).

The fixtures in data/torchrun/ are real output, as captured (torch 2.13, Python 3.11):

- rank_raised.txt: `torchrun --nproc-per-node 2 raise.py`'s stderr, rank 1 raising
  RuntimeError (plain torchrun: the rank's own traceback comes through torchrun too).
- rank_raised_recorded.txt: the same with raise.py's main under torch's @record, so the
  rank's traceback holds one of torch's frames and fills the block's traceback field.
- rank_raised_joined_node.txt: node 1 of two, its torchrun started as the node script
  starts it there (`python -c "$orchestrator_torchrun"`: frames in `<string>`), rank 3 raising.
- sigterm.txt: `torchrun --nproc-per-node 2 sleep.py`'s stderr, torchrun sent SIGTERM.
- sigterm_twice.txt: the same with ranks that take 2 s to end on SIGTERM, and a second
  SIGTERM to torchrun 0.7 s after the first: it lands in subprocess.py's wait for them,
  and Python chains a second SignalException's traceback to the first.
- combined_restarts.log: combined.log of `orchestrator launch hostfiles/local.txt
  --max-restarts 1 -- failall.py` (every rank raises: torchrun gives up, `bash FAILED`).
- combined_stopped.log: combined.log of a launch whose rank 1 raised while rank 0 slept:
  torchrun's shutdown after the orchestrator's stop, a rank's line inside its traceback.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from orchestrator.console.reading import NodeReports
from orchestrator.console.sink import LogSink
from orchestrator.console.torchrun_reports import ReportFilter, reported_line

DATA = Path(__file__).parents[2] / "data" / "torchrun"
BANNER = 4  # torchrun's OMP_NUM_THREADS notice, the first lines of the plain captures
REPORT_WORDS = (
    "ChildFailedError",
    "SignalException",
    "FAILED",
    "Failures:",
    "Root Cause",
    "To enable traceback",
    "host      :",
    "death signal",
    "closing signal",
    "failed (exitcode",
    "=====",
)


def lines_of(name: str) -> list[bytes]:
    return (DATA / name).read_bytes().splitlines(keepends=True)


def shown(lines: list[bytes]) -> list[bytes]:
    reports: ReportFilter[bytes] = ReportFilter()
    out = [kept for line in lines for kept in reports.feed(line, line)]
    return out + reports.drain()


def no_report_in(lines: list[bytes]) -> None:
    text = b"".join(lines).decode()
    for word in REPORT_WORDS:
        assert word not in text, (word, text)


@pytest.mark.parametrize(
    ("name", "own"),
    [
        ("rank_raised.txt", 4),  # the rank's traceback, whole
        ("rank_raised_joined_node.txt", 4),
        ("rank_raised_recorded.txt", 9),  # through @record's frame in torch: still its own
        ("sigterm.txt", 0),
        ("sigterm_twice.txt", 0),
    ],
)
def test_torchruns_reports_go_and_everything_else_stays_in_order(name: str, own: int) -> None:
    lines = lines_of(name)
    assert shown(lines) == lines[: BANNER + own]
    no_report_in(shown(lines))


def test_the_captures_hold_what_is_to_go() -> None:
    text = b"".join(lines_of("rank_raised.txt") + lines_of("sigterm.txt")).decode()
    for word in REPORT_WORDS:
        assert word in text, word


def test_a_torchrun_traceback_with_another_ending_is_shown_whole() -> None:
    # torchrun's own frames, but an error of its own (not a report of someone else's)
    lines = lines_of("sigterm.txt")[7:]
    assert lines[0].startswith(b"Traceback") and b"SignalException" in lines[-1]
    lines[-1] = b"torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError: timed out\n"
    assert shown(lines) == lines


def test_a_traceback_is_shown_as_soon_as_a_frame_of_another_file_comes() -> None:
    reports: ReportFilter[bytes] = ReportFilter()
    lines = lines_of("rank_raised.txt")[4:8]  # the rank's own, through plain torchrun
    assert reports.feed(lines[0], lines[0]) == []
    assert reports.pending() == [lines[0]]
    assert reports.feed(lines[1], lines[1]) == lines[:2]
    assert reports.feed(lines[2], lines[2]) == [lines[2]]


def test_a_chaining_not_followed_by_torchruns_traceback_is_shown_in_order() -> None:
    lines = lines_of("sigterm_twice.txt")
    chained = lines.index(b"During handling of the above exception, another exception occurred:\n")
    first, chaining = lines[: chained - 1], lines[chained - 1 : chained + 2]
    assert shown(first + chaining) == lines[:BANNER] + chaining  # the stream ended there
    after = b"the node's own line\n"
    assert shown(first + chaining + [after]) == lines[:BANNER] + chaining + [after]
    user = [b"Traceback (most recent call last):\n", b'  File "/home/u/train.py", line 3\n']
    assert shown(first + chaining + user) == lines[:BANNER] + chaining + user


def test_an_unfinished_traceback_waits_then_is_drained() -> None:
    reports: ReportFilter[str] = ReportFilter()
    head = lines_of("sigterm.txt")[7:12]
    assert [reports.feed(line, f"item {n}") for n, line in enumerate(head)] == [[]] * 5
    assert reports.pending() == [f"item {n}" for n in range(5)]
    assert reports.drain() == [f"item {n}" for n in range(5)]
    assert reports.feed(b"next\n", "next") == ["next"]


def test_a_line_of_another_shape_ends_the_block_and_is_shown() -> None:
    lines = lines_of("rank_raised.txt")[10:31]  # torchrun's traceback, the block's head
    assert b"Failures:" in lines[-1]
    after = b"orchestrator: the node's own line\n"
    assert shown([*lines, after]) == [after]
    # before the block's first border, only the border belongs to it
    assert shown([*lines_of("rank_raised.txt")[10:27], after]) == [after]


def test_log_lines_are_told_by_their_message() -> None:
    assert reported_line(lines_of("sigterm.txt")[4])  # Received 15 death signal
    assert not reported_line(lines_of("sigterm.txt")[2])  # the OMP_NUM_THREADS notice
    assert reported_line(
        b"WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 7 closing "
        b"signal SIGTERM"
    )  # older torch: logging's own format
    assert not reported_line(b"failed (exitcode: 1) local_rank: 0")  # not torch's log line
    assert not reported_line(
        b"E1128 08:02:49.565000 1 torch/distributed/elastic/rendezvous/api.py:9] "
        b"rendezvous timed out"
    )


def sink(tmp_path: Path, console: io.BytesIO, fold: bool = False) -> LogSink:
    return LogSink(
        tmp_path / "logs",
        {0: "n1 r2", 1: "n1 r3"},
        {0: "n1"},
        console,
        color=False,
        fold=fold,
        clock=lambda: 0.0,
    )


@pytest.mark.parametrize("fold", [False, True])
def test_the_console_and_the_last_lines_leave_them_to_the_files(tmp_path: Path, fold: bool) -> None:
    data = (DATA / "rank_raised_joined_node.txt").read_bytes()
    console = io.BytesIO()
    logs = sink(tmp_path, console, fold)
    lines = data.splitlines(keepends=True)
    for start in range(0, len(lines), 7):  # chunks that cut the traceback and block
        logs.node_output(0, b"".join(lines[start : start + 7]))
    logs.close()
    kept = lines[: BANNER + 4]
    assert console.getvalue() == b"".join(b"[n1] " + line for line in kept)
    assert logs.last_lines(node=0) == [line.decode().rstrip("\n") for line in kept]
    assert (tmp_path / "logs" / "node-0.log").read_bytes() == data
    combined = (tmp_path / "logs" / "combined.log").read_bytes()
    assert combined == b"".join(b"[n1] " + line for line in lines)


def test_lines_after_a_stop_stay_off_the_console_and_reports_out_of_the_last_lines(
    tmp_path: Path,
) -> None:
    console = io.BytesIO()
    logs = sink(tmp_path, console)
    logs.node_output(0, b"orchestrator: NCCL/gloo interface lo (route to 127.0.0.1)\n")
    logs.node_output(0, (DATA / "sigterm.txt").read_bytes(), console=False)
    assert console.getvalue() == b"[n1] orchestrator: NCCL/gloo interface lo (route to 127.0.0.1)\n"
    last = logs.last_lines(node=0)
    assert len(last) == 1 + BANNER and last[0].startswith("orchestrator: NCCL/gloo")
    assert logs.node_reports[0].pending() == []


def test_a_held_traceback_is_among_the_last_lines_while_it_waits(tmp_path: Path) -> None:
    logs = sink(tmp_path, io.BytesIO())
    logs.node_output(0, b"".join(lines_of("sigterm.txt")[7:10]))
    assert logs.last_lines(node=0) == [
        line.decode().rstrip("\n") for line in lines_of("sigterm.txt")[7:10]
    ]


@pytest.mark.parametrize("name", ["combined_restarts.log", "combined_stopped.log"])
def test_logs_reads_the_combined_log_as_the_console_showed_it(name: str) -> None:
    lines = lines_of(name)
    node = [line for line in lines if line.startswith(b"[localhost] ")]
    assert node, "the capture holds torchrun's report"
    expected = [line for line in lines if not line.startswith(b"[localhost] ")]
    assert list(NodeReports().lines(lines)) == expected
    ticks = [line for pair in zip(lines, [b""] * len(lines), strict=True) for line in pair]
    assert [line for line in NodeReports().lines(ticks) if line] == expected


def test_logs_tail_counts_the_lines_a_console_shows(tmp_path: Path) -> None:
    path = tmp_path / "combined.log"
    path.write_bytes((DATA / "combined_restarts.log").read_bytes())
    expected = [line for line in lines_of("combined_restarts.log") if b"[localhost] " not in line]
    end = path.stat().st_size
    assert NodeReports().tail(path, 3, end, None) == expected[-3:]
    assert NodeReports().tail(path, 200, end, None) == expected
    keep = lambda line: line.startswith(b"[localhost")  # noqa: E731  (--node localhost)
    assert NodeReports().tail(path, 4, end, keep) == [x for x in expected if keep(x)][-4:]
    # from `end` on, the same NodeReports reads what follows
    assert NodeReports().tail(path, 0, end, None) == []
