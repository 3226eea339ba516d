"""What wakes a quiet agent (orchestrator.agent.wakeup), on a real directory, pipe and child.

A quiet agent sleeps up to wakeup.QUIET_S; the tests give it a minute, so a pass that ends
in seconds was woken by what the test did, not by its timeout."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from orchestrator.agent.main import POLL_S, Agent
from orchestrator.agent.wakeup import Wakeup
from orchestrator.backends.sessions import FrameParser

ASLEEP_S = 60.0  # the sleep the tests put the agent in; a wake-up comes long before


@pytest.fixture
def wakeup(tmp_path: Path):
    watch = Wakeup(str(tmp_path))
    yield watch
    watch.close()


def readable(fds: list[int], timeout: float) -> list[int]:
    return select.select(fds, [], [], timeout)[0]


def test_a_write_in_the_directory_wakes_a_quiet_select_once_drained(
    wakeup: Wakeup, tmp_path: Path
) -> None:
    assert wakeup.files is not None, "this kernel gave no inotify watch"
    quiet = wakeup.descriptors(quiet=True)
    assert readable(quiet, 0) == []
    (tmp_path / "rank-0.out").write_bytes(b"hello\n")
    assert wakeup.files in readable(quiet, ASLEEP_S)
    wakeup.drain_files()
    assert readable(quiet, 0) == []  # drained: only a later write wakes it again
    with open(tmp_path / "rank-0.out", "ab") as out:
        out.write(b"again\n")
    assert wakeup.files in readable(quiet, ASLEEP_S)


def test_a_busy_loop_is_not_woken_by_every_write(wakeup: Wakeup) -> None:
    assert wakeup.descriptors(quiet=False) == [wakeup.signals]


def test_a_childs_end_wakes_it(wakeup: Wakeup) -> None:
    child = subprocess.Popen(["sleep", "0.2"])
    try:
        assert wakeup.signals in readable([wakeup.signals], ASLEEP_S)
    finally:
        child.wait()


def test_without_a_directory_or_a_watch_only_signals_wake_it(tmp_path: Path) -> None:
    for directory in (None, str(tmp_path / "missing")):
        watch = Wakeup(directory)
        try:
            assert watch.files is None
            assert watch.descriptors(quiet=True) == [watch.signals]
        finally:
            watch.close()


def test_close_puts_back_the_signal_handling_it_found(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGCHLD)
    Wakeup(str(tmp_path)).close()
    assert signal.getsignal(signal.SIGCHLD) is before
    assert signal.set_wakeup_fd(-1) == -1  # no wakeup fd left behind


# --- the agent's loop, one pass at a time -----------------------------------------------


@pytest.fixture
def asleep(tmp_path: Path):
    """An agent for rank 0 of `tmp_path`, asleep (a minute's wait), and the read end of the
    pipe its frames go to."""
    agent = Agent({"node_dir": str(tmp_path), "ranks": [0], "heartbeat_timeout": 0})
    frames_out, agent.outbox.fd = os.pipe()
    agent.stdin_open = False  # no controller: nothing on stdin
    agent.wakeup = Wakeup(str(tmp_path))
    agent.quiet_wait = agent.wait = ASLEEP_S
    yield agent, frames_out
    agent.wakeup.close()
    os.close(frames_out)
    os.close(agent.outbox.fd)


def test_a_sleeping_agent_ships_a_line_as_soon_as_the_rank_writes_it(
    asleep: tuple[Agent, int], tmp_path: Path
) -> None:
    agent, frames_out = asleep
    out = tmp_path / "rank-0.out"
    out.write_bytes(b"")
    agent.wakeup.drain_files()

    def rank_prints() -> None:
        with open(out, "ab") as handle:
            handle.write(b"step 100 loss 0.25\n")

    threading.Timer(0.3, rank_prints).start()
    began = time.monotonic()
    agent.step()
    woke_after = time.monotonic() - began
    agent.outbox.write_some()
    sent = FrameParser().feed(os.read(frames_out, 1 << 16))
    assert woke_after < ASLEEP_S / 2, f"slept {woke_after:.1f} s: the write did not wake it"
    assert sent == [("O", ("0",), b"step 100 loss 0.25\n")]
    assert agent.wait == POLL_S  # output came: it reads at the busy pace again


def test_a_sleeping_agent_wakes_when_its_script_ends(asleep: tuple[Agent, int]) -> None:
    agent, _frames_out = asleep
    agent.processes.proc = subprocess.Popen(["sleep", "0.3"])
    began = time.monotonic()
    agent.step()
    woke_after = time.monotonic() - began
    assert woke_after < ASLEEP_S / 2, f"slept {woke_after:.1f} s: the child's end did not wake it"
    assert agent.processes.script_rc == 0  # reaped in the same pass


@pytest.mark.parametrize(("code", "ended"), [(138, True), (0, False)])
def test_once_every_rank_here_stopped_on_the_warning_the_agent_ends_torchrun(
    asleep: tuple[Agent, int], tmp_path: Path, code: int, ended: bool
) -> None:
    """After the warning, the node's only rank exits 138 (saved): what is left, torchrun's
    own exit (a sleeping script here), is stopped at once. A rank that exited 0 finished
    its work: torchrun is left to end by itself (its exit barrier waits for the others)."""
    agent, _ = asleep
    agent.config["argv"] = ["bash", "-c", "sleep 60"]
    agent.quiet_wait = agent.wait = POLL_S
    agent.start()
    try:
        agent.warned = True
        (tmp_path / "rank-0.exit").write_text(f"{code} {time.time():.6f}\n")
        deadline = time.monotonic() + (5 if ended else 1)
        while agent.processes.script_rc is None and time.monotonic() < deadline:
            agent.step()
        assert agent.processes.stopping is ended
        assert agent.processes.script_rc == (-signal.SIGTERM if ended else None)
    finally:
        if agent.processes.script_rc is None:
            os.killpg(agent.processes.proc.pid, signal.SIGKILL)
            agent.processes.proc.wait()
