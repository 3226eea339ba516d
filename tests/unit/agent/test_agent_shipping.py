"""The agent's log shipping (orchestrator.agent.shipping, .ranks), on real files and pipes."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from orchestrator.agent.disk import DiskWatch
from orchestrator.agent.protocol import frame
from orchestrator.agent.ranks import MAX_LINE, NodeRanks, RankFile, read_exit
from orchestrator.agent.shipping import MAX_PENDING_OUT, Outbox, PipeLines
from orchestrator.backends.sessions import FrameParser


def node_ranks(directory: Path, ranks: list[int], outbox: Outbox) -> NodeRanks:
    return NodeRanks(str(directory), ranks, outbox, DiskWatch(str(directory), None, outbox))


def frames(outbox: Outbox) -> list[tuple[str, tuple[str, ...], bytes]]:
    sent = FrameParser().feed(bytes(outbox.data))
    outbox.data.clear()
    return sent


# --- the outbox -------------------------------------------------------------------------


def test_outbox_masks_payloads_but_not_headers() -> None:
    outbox = Outbox(["hunter2", ""])
    outbox.output(3, b"password hunter2 and hunter2\n")
    outbox.output(3, b"")  # nothing to say: no frame
    outbox.message("token hunter2")
    outbox.send(frame("E", 3, 0, "1.0"))
    assert frames(outbox) == [
        ("O", ("3",), b"password *** and ***\n"),
        ("M", (), b"token ***"),
        ("E", ("3", "0", "1.0"), b""),
    ]


def test_outbox_writes_what_the_pipe_takes_and_flushes_the_rest() -> None:
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    outbox = Outbox([], fd=write_end)
    big = b"x" * (MAX_PENDING_OUT // 4)
    outbox.output(0, big)
    outbox.write_some()  # a pipe takes 64 KiB or so without a reader
    assert 0 < len(outbox.data) < len(big)
    received = bytearray()
    with open(read_end, "rb", buffering=0) as reader:
        thread = threading.Thread(target=lambda: received.extend(reader.read()))
        thread.start()
        outbox.flush(10)
        os.close(write_end)
        thread.join(10)
    assert not outbox.data and FrameParser().feed(bytes(received)) == [("O", ("0",), big)]


def test_outbox_forgets_everything_once_the_controller_is_gone() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)
    outbox = Outbox([], fd=write_end)
    outbox.message("anyone?")
    outbox.write_some()  # EPIPE: Python ignores SIGPIPE, as the agent does
    assert not outbox.open and not outbox.data
    outbox.message("still there?")
    assert not outbox.data
    os.close(write_end)


# --- the script's pipe and the ranks' files --------------------------------------------


def test_pipe_lines_are_whole_and_the_last_one_comes_at_the_end() -> None:
    proc = subprocess.Popen(
        ["bash", "-c", "printf 'a\\nb'; sleep 0.3; printf 'c\\nd'"], stdout=subprocess.PIPE
    )
    lines = PipeLines(proc.stdout)
    got = []
    while lines.pipe is not None:
        got.append(lines.read_lines())
    proc.wait()
    assert b"".join(got) == b"a\nbc\nd\n"
    assert all(piece.endswith(b"\n") for piece in got if piece)


def test_rank_file_cuts_whole_lines_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.out"
    rank = RankFile(0, str(path))
    assert rank.read_lines(1 << 20) == b"" and rank.at_end()  # not created yet
    with path.open("ab", buffering=0) as out:
        out.write(b"one\ntw")
        assert rank.read_lines(1 << 20) == b"one\n"
        assert rank.at_end()
        out.write(b"o\nthree")
        assert not rank.at_end()
        assert rank.read_lines(1 << 20) == b"two\n"
    assert rank.rest() == b"three\n" and rank.rest() == b""


def test_rank_file_passes_an_endless_line_on_in_pieces(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.out"
    path.write_bytes(b"y" * (MAX_LINE + 10))
    rank = RankFile(0, str(path))
    assert rank.read_lines(MAX_LINE) == b"y" * MAX_LINE
    assert rank.read_lines(MAX_LINE) == b""  # 10 bytes wait for their newline
    assert rank.rest() == b"y" * 10 + b"\n"


def test_rank_file_reads_no_more_than_its_budget(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.out"
    path.write_bytes(b"line\n" * 100)
    rank = RankFile(0, str(path))
    assert rank.read_lines(12) == b"line\nline\n"  # 12 bytes read, the 3rd line's start kept
    assert rank.read_lines(1 << 20) == b"line\n" * 98


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("0 12.5\n", "0 12.5\n"),
        ("1 12.5 /tmp/err.json\n", "1 12.5 /tmp/err.json\n"),
        ("1 12.5", None),
        ("", None),
    ],
)
def test_read_exit_waits_for_the_whole_line(tmp_path: Path, text, line) -> None:
    path = tmp_path / "rank-0.exit"
    path.write_text(text)
    assert read_exit(str(path)) == line
    assert read_exit(str(tmp_path / "missing.exit")) is None


def test_a_rank_exit_follows_all_of_its_output(tmp_path: Path) -> None:
    outbox = Outbox(["s3cret"])
    ranks = node_ranks(tmp_path, [0, 1], outbox)
    (tmp_path / "rank-0.out").write_bytes(b"first\nlast without newline")
    (tmp_path / "rank-0.exit").write_text("1 5.5 " + str(tmp_path / "error.json") + "\n")
    (tmp_path / "error.json").write_text('{"message": "s3cret failed"}')
    ranks.ship_exits()
    assert frames(outbox) == []  # its output is not read yet: the exit waits
    ranks.ship_output()
    ranks.ship_exits()
    assert frames(outbox) == [
        ("O", ("0",), b"first\n"),
        ("O", ("0",), b"last without newline\n"),
        ("F", ("0",), b'{"message": "*** failed"}'),
        ("E", ("0", "1", "5.5", "0"), b""),  # before any stop
    ]
    assert ranks.exited == {0} and not ranks.all_exited()
    ranks.stopped_at = 5.9  # the agent began stopping the step (the node's clock)
    (tmp_path / "rank-1.exit").write_text("0 6.0\n")  # a rank that never wrote a line
    ranks.ship_output()
    ranks.ship_exits()
    ranks.ship_exits()
    assert frames(outbox) == [("E", ("1", "0", "6.0", "1"), b"")]  # once; after the stop
    assert ranks.all_exited()


def test_a_restarted_rank_reports_each_of_its_exits(tmp_path: Path) -> None:
    outbox = Outbox([])
    ranks = node_ranks(tmp_path, [0], outbox)
    (tmp_path / "rank-0.out").write_bytes(b"attempt 0\n")
    (tmp_path / "rank-0.exit").write_text("1 5.0\n")
    ranks.ship_output()
    ranks.ship_exits()
    ranks.ship_exits()
    # torchrun --max-restarts started it again; run_rank writes the exit file anew.
    with (tmp_path / "rank-0.out").open("ab") as out:
        out.write(b"attempt 1\n")
    (tmp_path / "rank-0.exit").write_text("0 9.0\n")
    ranks.ship_exits()  # its new output is not read yet
    ranks.ship_output()
    ranks.ship_exits()
    assert frames(outbox) == [
        ("O", ("0",), b"attempt 0\n"),
        ("E", ("0", "1", "5.0", "0"), b""),
        ("O", ("0",), b"attempt 1\n"),
        ("E", ("0", "0", "9.0", "0"), b""),
    ]


def test_output_waits_while_the_outbox_is_full(tmp_path: Path) -> None:
    outbox = Outbox([])
    ranks = node_ranks(tmp_path, [0], outbox)
    (tmp_path / "rank-0.out").write_bytes(b"line\n")
    outbox.send(b"x" * MAX_PENDING_OUT)
    ranks.ship_output()
    assert len(outbox.data) == MAX_PENDING_OUT
    outbox.data.clear()
    ranks.ship_output()
    assert frames(outbox) == [("O", ("0",), b"line\n")]


def test_drain_sends_everything_left_then_the_unfinished_line(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    outbox = Outbox([], fd=write_end)
    ranks = node_ranks(tmp_path, [0], outbox)
    (tmp_path / "rank-0.out").write_bytes(b"a\nb")
    ranks.drain(flush_timeout=5)  # whole lines are written as they are read
    os.close(write_end)
    with open(read_end, "rb") as reader:
        assert FrameParser().feed(reader.read()) == [("O", ("0",), b"a\n")]
    assert frames(outbox) == [("O", ("0",), b"b\n")]  # the rest goes with the X that follows


def test_rank_files_left_on_the_node_are_masked(tmp_path: Path) -> None:
    ranks = node_ranks(tmp_path, [0, 1], Outbox(["s3cret"]))
    (tmp_path / "rank-0.out").write_bytes(b"key=s3cret\nplain\n")
    ranks.mask_files()  # rank 1 never started: nothing to mask, no error
    assert (tmp_path / "rank-0.out").read_bytes() == b"key=***\nplain\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-0.out"]


def test_without_a_node_dir_there_are_no_ranks() -> None:
    outbox = Outbox([])
    ranks = NodeRanks(None, [0, 1], outbox, DiskWatch(None, None, outbox))
    ranks.ship_output()
    ranks.ship_exits()
    assert ranks.files == [] and not ranks.all_exited()
