"""The node agent as the SLURM batch script runs it (orchestrator.agent.keeper), on this
machine without SLURM: the bundle job.sbatch pipes into the node's interpreter, the stream
it keeps for a controller that comes late, and the dial a controller runs through srun (the
agent started as a process of its own: tests/local/test_keeper_local.py)."""

from __future__ import annotations

import signal
from pathlib import Path

from orchestrator.agent.limit_warning import HeldWarning
from orchestrator.agent.protocol import Frame, frame
from orchestrator.agent.relay import listen
from orchestrator.agent.replay import KEPT_BYTES, Stream
from orchestrator.backends.sessions import FrameParser


def test_the_stream_keeps_whole_frames_and_says_what_a_late_reader_lost(monkeypatch) -> None:
    stream = Stream()
    shown = stream.add(frame(Frame.SCRIPT_OUTPUT, 0, payload=b"torchrun says\n")[:9])
    assert shown == []  # the payload is not whole yet
    rest = frame(Frame.SCRIPT_OUTPUT, 0, payload=b"torchrun says\n")[9:]
    shown = stream.add(rest + frame(Frame.HEARTBEAT, "1.0", "-", "-"))
    assert shown == [("N", b"torchrun says\n")]
    assert stream.since(0) == (0, 0) and stream.since(10**9) == (stream.end, 0)
    monkeypatch.setattr("orchestrator.agent.replay.KEPT_BYTES", 40)
    monkeypatch.setattr("orchestrator.agent.replay.TRIM_STEP", 1)
    big = frame(Frame.RANK_OUTPUT, 3, payload=b"x" * 30 + b"\n")
    stream.add(big)
    assert stream.end - stream.base == len(big)  # the oldest whole frames went
    assert stream.since(0) == (stream.base, stream.base)
    parsed = FrameParser().feed(bytes(stream.kept))  # what is left starts at a frame
    assert parsed == [("O", ("3",), b"x" * 30 + b"\n")]
    assert KEPT_BYTES >= 1 << 20


def test_the_socket_folder_must_be_the_users_alone(tmp_path: Path, capsys) -> None:
    """A folder others can write to (one another user made in /tmp, say) could serve or
    swap the socket: the agent then runs without one, and says so."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    assert listen(str(shared / "1.0.0.sock")) is None
    assert "not a folder of this user's alone" in capsys.readouterr().err
    own = tmp_path / "own"
    listener = listen(str(own / "1.0.0.sock"))
    assert listener is not None and (own.stat().st_mode & 0o777) == 0o700
    listener.close()


def test_a_long_stream_of_small_frames_keeps_few_marks_and_its_bound(monkeypatch) -> None:
    monkeypatch.setattr("orchestrator.agent.replay.KEPT_BYTES", 1 << 20)
    stream = Stream()
    beat = frame(Frame.HEARTBEAT, "1795935108.522808", "-", "-")
    for _ in range(100_000):  # 4 MB of heartbeats
        stream.add(beat)
    assert stream.end == 100_000 * len(beat)
    assert stream.end - stream.base <= (1 << 20) + (64 << 10) + len(beat)
    assert len(stream.starts) <= 20
    kinds = {kind for kind, _, _ in FrameParser().feed(bytes(stream.kept))}
    assert kinds == {"H"}  # it still begins at a frame


def test_a_held_warning_goes_to_each_rank_once_it_catches_it_and_never_twice() -> None:
    """SLURM's warning came while rank 1 was still starting (it ignored it) and rank 0 had
    its handler (it got it then: `seen`). Rank 1 gets it from the agent once it catches
    it, once; rank 0 never again; rank 2, whose program is not Python (its children are
    the targets), gets it when its child catches it."""
    catching: set[int] = {100}
    sent: list[tuple[int, int]] = []
    held = HeldWarning(signal.SIGUSR1, seen={100})
    targets = {0: [100], 1: [101], 2: [102, 103]}

    def deliver() -> list[int]:
        return held.deliver(targets, lambda pid, _: pid in catching, lambda *a: sent.append(a))

    assert deliver() == [] and sent == []  # rank 1 still starting: held
    catching.add(101)
    assert deliver() == [1] and sent == [(101, signal.SIGUSR1)]
    assert deliver() == [] and len(sent) == 1  # never twice
    catching.add(103)
    assert deliver() == [2] and sent[-1] == (103, signal.SIGUSR1)
    targets[1] = [104]  # torchrun started rank 1 again: its new process is warned too
    catching.add(104)
    assert deliver() == [1] and sent[-1] == (104, signal.SIGUSR1)
