"""The node agent as the SLURM batch script runs it (orchestrator.agent.keeper), on this
machine without SLURM: the bundle job.sbatch pipes into the node's interpreter, the stream
it keeps for a controller that comes late, and the dial a controller runs through srun."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.agent import BOOTSTRAP
from orchestrator.agent.bootstrap import slurm_bundle
from orchestrator.agent.keeper import DIAL, KEPT_BYTES, Stream, listen, socket_path, stopped_file
from orchestrator.agent.limit_warning import HeldWarning
from orchestrator.agent.protocol import Frame, frame
from orchestrator.backends.sessions import FrameParser


def test_the_stream_keeps_whole_frames_and_says_what_a_late_reader_lost(monkeypatch) -> None:
    stream = Stream()
    shown = stream.add(frame(Frame.SCRIPT_OUTPUT, 0, payload=b"torchrun says\n")[:9])
    assert shown == []  # the payload is not whole yet
    rest = frame(Frame.SCRIPT_OUTPUT, 0, payload=b"torchrun says\n")[9:]
    shown = stream.add(rest + frame(Frame.HEARTBEAT, "1.0", "-", "-"))
    assert shown == [("N", b"torchrun says\n")]
    assert stream.since(0) == (0, 0) and stream.since(10**9) == (stream.end, 0)
    monkeypatch.setattr("orchestrator.agent.keeper.KEPT_BYTES", 40)
    monkeypatch.setattr("orchestrator.agent.keeper.TRIM_STEP", 1)
    big = frame(Frame.RANK_OUTPUT, 3, payload=b"x" * 30 + b"\n")
    stream.add(big)
    assert stream.end - stream.base == len(big)  # the oldest whole frames went
    assert stream.since(0) == (stream.base, stream.base)
    parsed = FrameParser().feed(bytes(stream.kept))  # what is left starts at a frame
    assert parsed == [("O", ("3",), b"x" * 30 + b"\n")]
    assert KEPT_BYTES >= 1 << 20


def test_the_agent_runs_alone_and_a_controller_that_comes_late_gets_it_all(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    env = {
        **os.environ,
        "SLURM_JOB_ID": f"9{os.getpid()}",
        "SLURM_NODEID": "0",
        "SLURM_RESTART_COUNT": "0",
        "ORCHESTRATOR_JOB_DIR": str(job_dir),
    }
    script = (
        'echo started; echo hello > "$ORCHESTRATOR_NODE_DIR/rank-0.out"; '
        'read -t 60 line < "$ORCHESTRATOR_NODE_DIR/fifo"; '
        'echo "0 $(date +%s)" > "$ORCHESTRATOR_NODE_DIR/rank-0.exit"; echo done; exit 3'
    )
    config = {"argv": ["bash", "-c", script], "nproc": 1, "grace": 1.0}  # node 0: rank 0
    node_dir = job_dir / "attempt0" / "node0"
    node_dir.mkdir(parents=True)
    os.mkfifo(node_dir / "fifo")
    keeper = subprocess.Popen(
        [sys.executable, "-I", "-S", "-u", "-c", BOOTSTRAP, "orchestrator-agent", "t"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    )
    keeper.stdin.write(slurm_bundle(config))
    keeper.stdin.close()
    path = socket_path(env["SLURM_JOB_ID"], 0, 0)
    try:
        time.sleep(1.5)  # the agent runs with nobody connected; what it says is kept
        keeper.send_signal(signal.SIGUSR1)  # the time limit's, as srun passes it on
        dial = subprocess.Popen(
            [sys.executable, "-I", "-S", "-u", "-c", DIAL, path, "0", "10"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        dial.stdin.write(b"stacks 1 signal\n")  # a command reaches the agent
        dial.stdin.flush()
        time.sleep(1.0)
        with open(node_dir / "fifo", "w") as fifo:
            fifo.write("go\n")
        out = dial.stdout.read()  # to the end of the stream: stdin stays open (closed, the
        # dial leaves). The script ended 3 after the warning: its ranks stopped on it, which
        # is no failure of the node's, so srun's task ends 0 (srun's --kill-on-bad-exit
        # would end the step on nodes still saving) and the code is kept for the script.
        assert keeper.wait(timeout=30) == 0
        dial.stdin.close()
        dial.wait(timeout=10)
    finally:
        keeper.kill()
    head, _, frames = out.partition(b"\n")
    assert head == b"at 0 0"
    kinds = [kind for kind, _, _ in FrameParser().feed(frames)]
    assert kinds[0] == "S" and kinds[-1] == "X" and "K" in kinds, kinds
    parsed = FrameParser().feed(frames)
    output = b"".join(data for kind, _, data in parsed if kind == "N")
    assert output == b"started\ndone\n"
    assert [fields for kind, fields, _ in parsed if kind == "X"][0][0] == "3"
    # The node's rank ships as over SSH: its lines, then its exit; and the signal is told.
    assert [data for kind, fields, data in parsed if kind == "O"] == [b"hello\n"]
    assert [fields[:2] for kind, fields, _ in parsed if kind == "E"] == [("0", "0")]
    (warned,) = [fields for kind, fields, _ in parsed if kind == "G"]
    assert warned[0] == "USR1" and warned[2:] == ("-", "-")
    assert not os.path.exists(path)  # the socket goes with the agent
    assert Path(stopped_file(path)).read_text() == "3\n"
    os.unlink(stopped_file(path))
    assert keeper.stdout.read() == b""  # with a job folder, nothing for SLURM's output file


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
    monkeypatch.setattr("orchestrator.agent.keeper.KEPT_BYTES", 1 << 20)
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
