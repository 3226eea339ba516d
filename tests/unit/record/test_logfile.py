"""The run record when the controller's disk fills: LogSink and status.json never raise, the
console goes on, a rank file stops whole at its first loss and is marked incomplete, the
other files continue once space returns (orchestrator.record.logfile); and the rank files filled
from the node's copy through a real local agent (orchestrator.nodes.refill).

The full disk is simulated at the one boundary it crosses, the file object (`Disk`), or is
real (/dev/full); the end-to-end test on a real full tmpfs is test_full_disk_local.py."""

from __future__ import annotations

import errno
import io
import json
import os
import sys
import time
from pathlib import Path

import pytest

from orchestrator.backends.local import LocalConnection
from orchestrator.console.sink import LogSink
from orchestrator.errors import ConfigError
from orchestrator.nodes.refill.complete import Completion, fetch_incomplete
from orchestrator.nodes.refill.fetch import FetchSink, Refill, fill_gaps
from orchestrator.nodes.refill.gaps import Gap
from orchestrator.record import logfile
from orchestrator.record.runs import RunRecord, process_start_time

WARNING = b"warning: cannot write the run record: No space left on device"


class Disk:
    """A file system with `free` bytes left: write(2) takes what fits, then ENOSPC."""

    def __init__(self, free: int) -> None:
        self.free = free

    def opener(self, path: Path) -> FileOnDisk:
        return FileOnDisk(open(path, "ab", buffering=0), self)  # noqa: SIM115


class FileOnDisk:
    def __init__(self, raw, disk: Disk) -> None:
        self.raw, self.disk = raw, disk

    def write(self, data) -> int:
        if self.disk.free <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written = self.raw.write(bytes(data[: self.disk.free]))
        self.disk.free -= written
        return written

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.raw.seek(offset, whence)

    def truncate(self, size: int) -> int:
        self.disk.free += os.fstat(self.raw.fileno()).st_size - size
        return self.raw.truncate(size)

    def close(self) -> None:
        self.raw.close()


def make_sink(tmp_path: Path, disk: Disk, console: io.BytesIO) -> LogSink:
    return LogSink(
        tmp_path / "logs", {0: "a r0", 1: "a r1"}, {0: "a"}, console, False, opener=disk.opener
    )


def lines(rank: int, start: int, stop: int) -> bytes:
    return b"".join(b"rank %d line %06d %s\n" % (rank, i, b"x" * 40) for i in range(start, stop))


def test_a_full_disk_warns_once_and_the_console_goes_on(tmp_path) -> None:
    console = io.BytesIO()
    sink = make_sink(tmp_path, Disk(free=5000), console)
    for i in range(0, 400, 20):
        sink.rank_output(0, lines(0, i, i + 20))
        sink.rank_output(1, lines(1, i, i + 20))
        sink.node_output(0, b"torchrun says %d\n" % i)
        sink.flush()
    sink.note("run succeeded")
    sink.close()
    shown = console.getvalue()
    assert shown.count(WARNING) == 1
    warning = next(line for line in shown.splitlines() if WARNING in line)
    assert warning.startswith(b"[orchestrator] ") and str(tmp_path / "logs").encode() in warning
    assert warning.endswith(b"; the job goes on, its output is kept whole on the nodes")
    for rank in (0, 1):  # every line reached the console, in order
        prefix = b"[a r%d] " % rank
        got = [
            line[len(prefix) :] + b"\n" for line in shown.splitlines() if line.startswith(prefix)
        ]
        assert b"".join(got) == lines(rank, 0, 400)
    assert shown.endswith(b"[orchestrator] run succeeded\n")


def test_a_rank_file_stops_whole_at_its_first_loss_and_is_marked(tmp_path) -> None:
    disk = Disk(free=3000)
    sink = make_sink(tmp_path, disk, io.BytesIO())
    sink.rank_output(0, lines(0, 0, 100))  # 6000 bytes: more than the disk has
    sink.flush()
    disk.free = 10**9  # space returns: a rank file with a hole would be worse than a short one
    sink.rank_output(0, lines(0, 100, 110))
    sink.rank_output(1, lines(1, 0, 10))
    sink.close()
    own = (tmp_path / "logs" / "rank-0.log").read_bytes()
    assert own and own.endswith(b"\n") and lines(0, 0, 100).startswith(own)
    assert sink.incomplete() == {0: (0, len(own))}
    assert (tmp_path / "logs" / "rank-1.log").read_bytes() == lines(1, 0, 10)


def test_a_partial_write_is_cut_back_to_its_last_whole_line(tmp_path) -> None:
    disk = Disk(free=15)
    sink = make_sink(tmp_path, disk, io.BytesIO())
    sink.rank_output(0, b"line one\nline two\n")  # 15 of 18 bytes fit
    sink.close()
    assert (tmp_path / "logs" / "rank-0.log").read_bytes() == b"line one\n"
    assert sink.incomplete() == {0: (0, 9)}


def test_the_start_of_a_rank_file_is_its_size_when_this_sink_opened_it(tmp_path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank-1.log").write_bytes(b"an earlier attempt\n")
    disk = Disk(free=100)
    sink = make_sink(tmp_path, disk, io.BytesIO())
    sink.rank_output(1, lines(1, 0, 10))
    sink.close()
    size = (tmp_path / "logs" / "rank-1.log").stat().st_size
    assert sink.incomplete() == {1: (19, size)} and 19 <= size < 19 + len(lines(1, 0, 10))


def test_the_other_files_go_on_after_a_gap_line_once_space_returns(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(logfile, "RETRY_S", 0.3)
    disk = Disk(free=0)
    sink = make_sink(tmp_path, disk, io.BytesIO())
    sink.note("first")  # lost
    sink.flush()
    disk.free = 10**9
    sink.note("too soon")  # space is back, but the file is not tried again yet
    sink.flush()
    assert not (tmp_path / "logs" / "combined.log").read_bytes()
    time.sleep(0.35)
    sink.note("later")
    sink.close()
    combined = (tmp_path / "logs" / "combined.log").read_bytes().splitlines()
    assert len(combined) == 2 and combined[1] == b"[orchestrator] later"
    assert (
        combined[0].startswith(b"[orchestrator] ") and b"bytes of output are missing" in combined[0]
    )


def test_closing_tries_once_more_and_marks_the_gap(tmp_path) -> None:
    disk = Disk(free=0)
    sink = make_sink(tmp_path, disk, io.BytesIO())
    sink.node_output(0, b"torchrun starts\n")
    sink.flush()
    disk.free = 10**9
    sink.close()  # whenever the last try was
    for name in ("node-0.log", "combined.log"):
        text = (tmp_path / "logs" / name).read_bytes()
        assert text.startswith(b"[orchestrator] ") and b"bytes of output are missing" in text


def test_a_file_that_cannot_be_opened_is_a_fault_too(tmp_path) -> None:
    console = io.BytesIO()

    def refuse(path: Path):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    sink = LogSink(tmp_path / "logs", {0: "a r0"}, {}, console, False, opener=refuse)
    sink.rank_output(0, b"hello\n")
    sink.close()
    assert console.getvalue().count(b"warning: cannot write the run record: Disk quota") == 1
    assert b"[a r0] hello\n" in console.getvalue()
    assert sink.incomplete() == {0: (0, 0)}


def test_status_write_on_a_full_disk_keeps_the_previous_file(tmp_path) -> None:
    record = RunRecord.create(tmp_path, "r1")
    assert record.write_status({"state": "running"}) is None
    # The temp file lands on a device that is always full: a real ENOSPC.
    (record.path / f".status.json.{os.getpid()}.tmp").symlink_to("/dev/full")
    error = record.write_status({"state": "succeeded"})
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC
    assert json.loads(record.status_path.read_text()) == {"state": "running"}
    assert sorted(p.name for p in record.path.iterdir()) == ["logs", "status.json"]
    assert record.write_status({"state": "succeeded"}) is None


def test_gaps_round_trip_through_status_and_bad_entries_are_config_errors(tmp_path) -> None:
    gap = Gap(3, "node1", "~/.orchestrator/runs/r/node1", 10, 20, "/usr/bin/python3", port=2222)
    assert Gap.from_status(json.loads(json.dumps(gap.as_status())), tmp_path) == gap
    assert "user" not in gap.as_status() and "why" not in gap.as_status()
    for bad in ({"rank": 3}, [1], {**gap.as_status(), "offset": 30}, {**gap.as_status(), "x": 1}):
        with pytest.raises(ConfigError, match="unreadable entry in incomplete_logs"):
            Gap.from_status(bad, tmp_path)


def test_completion_says_what_is_left_and_records_it() -> None:
    gaps = (Gap(0, "h", "~/d", 0, 5, "py"), Gap(3, "h", "~/d", 0, 5, "py"))
    done = Completion(filled=(1,), still=gaps)
    assert done.lines("r7", "runs", None) == [
        "rank file 1 was completed from the nodes' copies",
        "rank files 0, 3 are incomplete: run 'orchestrator logs r7 --fetch' when there is space",
    ]
    assert "--fetch --run-dir /x'" in done.lines("r7", "/x", None)[1]
    assert "h:~/d/rank-3.out" in done.lines("r7", "runs", OSError(28, "full"))[1]
    assert done.status(None)["incomplete_logs"][1]["rank"] == 3
    assert "kept" in done.kept_copies("r7") and Completion().kept_copies("r7") is None
    assert Completion().status(None) == {} and Completion().lines("r7", "runs", None) == []


def test_rank_files_are_filled_from_the_node_copy_through_a_local_agent(tmp_path) -> None:
    """Before the gap, the node's copy (masked, its last line ended), after the gap: kept."""
    logs, node1, node2 = tmp_path / "logs", tmp_path / "node1", tmp_path / "node2"
    for folder in (logs, node1, node2):
        folder.mkdir()
    printed = lines(3, 0, 3000) + b"password hunter2 and a last line without newline"
    (node1 / "rank-3.out").write_bytes(printed)
    # rank 3: an earlier attempt's lines, the start of this one's, then a later attempt's
    streamed = b"earlier\n" + printed[:5000]
    (logs / "rank-3.log").write_bytes(streamed + b"later\n")
    # rank 5: two gaps, one per attempt, on two node directories
    (node1 / "rank-5.out").write_bytes(b"one\ntwo\n")
    (node2 / "rank-5.out").write_bytes(b"three\nfour\n")
    (logs / "rank-5.log").write_bytes(b"one\nthree\n")
    python = sys.executable
    gaps = [
        Gap(3, "localhost", str(node1), 8, len(streamed), python),
        Gap(5, "localhost", str(node1), 0, 4, python),
        Gap(5, "localhost", str(node2), 4, 10, python),
        Gap(6, "localhost", str(node2), 0, 0, python),  # its copy is gone
    ]
    connection = LocalConnection("localhost")
    recorded = []
    try:
        still, failed = fill_gaps(
            gaps,
            lambda gap: connection,
            logs,
            mask=lambda data: data.replace(b"hunter2", b"***"),
            commit=recorded.append,
        )
    finally:
        connection.close()
    assert (logs / "rank-3.log").read_bytes() == (
        b"earlier\n" + printed.replace(b"hunter2", b"***") + b"\nlater\n"
    )
    assert (logs / "rank-5.log").read_bytes() == b"one\ntwo\nthree\nfour\n"
    assert [gap.rank for gap in still] == [6] and "gone" in still[0].why
    assert [refill.gone for refill in failed] == [True]
    assert all(gap.rank == 6 for gap in recorded[-1]) and not list(logs.glob(".*refill"))


def test_a_fill_that_cannot_be_written_leaves_the_file_as_it_was(tmp_path) -> None:
    logs, node = tmp_path / "logs", tmp_path / "node0"
    logs.mkdir()
    node.mkdir()
    (node / "rank-0.out").write_bytes(b"a\nb\n")
    (logs / "rank-0.log").write_bytes(b"a\n")
    (logs / ".rank-0.log.refill").symlink_to("/dev/full")  # the new file finds no space
    connection = LocalConnection("localhost")
    try:
        still, failed = fill_gaps(
            [Gap(0, "localhost", str(node), 0, 2, sys.executable)], lambda gap: connection, logs
        )
    finally:
        connection.close()
    assert (logs / "rank-0.log").read_bytes() == b"a\n"
    assert [gap.offset for gap in still] == [0] and "No space left on device" in failed[0].why


@pytest.mark.parametrize(
    ("state", "alive", "message"),
    [
        ("succeeded", False, "no rank file is listed as incomplete.*nothing to fetch"),
        ("running", False, "ended without writing the run's end.*was its disk full"),
        ("running", True, "is still running; fetch once it has ended"),
    ],
)
def test_fetch_refuses_when_there_is_nothing_to_fetch(tmp_path, state, alive, message) -> None:
    record = RunRecord.create(tmp_path, "r1")
    pid = os.getpid()
    controller = {"pid": pid, "start_time": process_start_time(pid) if alive else -1}
    record.write_status({"state": state, "controller": controller})
    with pytest.raises(ConfigError, match=message):
        fetch_incomplete(record, say=print)


def test_the_fetch_output_keeps_other_lines_and_refuses_garbled_ones(tmp_path) -> None:
    (tmp_path / "logs").mkdir()
    refills = [
        Refill(Gap(r, "h", "~/d", 0, 0, "py"), tmp_path / "logs", lambda d: d) for r in (0, 1)
    ]
    for refill in refills:
        refill.begin()
    sink = FetchSink({0: refills})
    sink.node_output(0, b"Welcome to node1\nD 0 aGkK\nD 1 !!notbase64\nD 7 aGkK\nend 0 3\n")
    assert (
        refills[0].new_size == 3
        and (tmp_path / "logs" / ".rank-0.log.refill").read_bytes() == b"hi\n"
    )
    assert refills[1].new_size is None and refills[1].why.startswith("garbled output from h:~/d")
    assert sink.output[0] == [b"Welcome to node1\nD 7 aGkK\n"]
