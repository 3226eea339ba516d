"""A rank whose peer dies or goes silent exits non-zero within a stated bound, never hangs.

Real processes joined by the real rendezvous (gloo on CPU): one rank is killed or stopped
mid-training and the survivor's exit code, time and message are checked. The bound, as the
README states it: a peer that exits is noticed at the next collective (seconds); a peer that
stops answering, after --timeout.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.trainer_helpers import (
    FAST,
    TRAINER,
    kill_group,
    start_ranks,
    torchrun_command,
    trainer_env,
    wait_for,
)

FOREVER = ["--epochs", "100000", "--log-every", "10", "--batch-size", "4"]
TIMEOUT_S = 6.0
# What the machine may add to the bound: process teardown, a loaded shared CPU.
SLACK_S = 10.0


def _exit_within(proc: subprocess.Popen[str], seconds: float) -> tuple[int, float]:
    started = time.monotonic()
    try:
        code = proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the surviving rank still runs {seconds} s later (hang)") from None
    return code, time.monotonic() - started


def _one_line_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(("sig", "bound"), [
    (signal.SIGKILL, SLACK_S),  # exits: gloo's next collective fails at once
    (signal.SIGSTOP, TIMEOUT_S + SLACK_S),  # silent: the collective times out
])  # fmt: skip
def test_survivor_exits_1_when_its_peer_dies_or_stops(
    tmp_path: Path, sig: signal.Signals, bound: float
) -> None:
    logs = tmp_path / "logs"
    procs = start_ranks(
        2, [*FAST, *FOREVER, "--timeout", f"{TIMEOUT_S:g}"], tmp_path / "rdzv", logs
    )
    try:
        wait_for(lambda: "step 20/" in (logs / "rank0.out").read_text(), 60, "training")
        procs[1].send_signal(sig)
        code, took = _exit_within(procs[0], bound)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert code == 1, (code, (logs / "rank0.err").read_text())
    line = _one_line_error((logs / "rank0.err").read_text())
    assert "rank 0 of 2: lost contact with the other ranks" in line, line
    if sig == signal.SIGSTOP:  # it waited for the timeout, not less
        assert took >= TIMEOUT_S - 1, took
        assert "Timed out" in line, line


def test_a_rank_that_never_comes_ends_the_other_after_the_timeout(tmp_path: Path) -> None:
    # Rank 1 of 2 is never started: rank 0 gives up the rendezvous after --timeout.
    cmd = [*TRAINER, *FAST, "--init-method", f"file://{tmp_path / 'rdzv'}", "--rank", "0",
           "--world-size", "2", "--timeout", "3"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=trainer_env())  # fmt: skip
    # The timeout counts from the rendezvous (its file appears), not from the start: a
    # CUDA build of torch can take longer to import on a busy machine than the slack.
    wait_for(lambda: (tmp_path / "rdzv").exists(), 120, "the rendezvous")
    code, took = _exit_within(proc, 3 + SLACK_S)
    err = proc.stderr.read() if proc.stderr else ""
    assert code == 1, err
    line = _one_line_error(err)
    assert "rank 0 of 2 could not join the process group" in line, line


def test_torchrun_job_ends_when_one_rank_is_killed(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    proc = subprocess.Popen(
        torchrun_command(2, [*FAST, *FOREVER, "--timeout", f"{TIMEOUT_S:g}"],
                         "--log-dir", str(logs), "--redirects", "3"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=trainer_env(),
        start_new_session=True,
    )  # fmt: skip

    def rank_output(rank: int) -> str:
        files = list(logs.rglob(f"attempt_0/{rank}/stdout.log"))
        return files[0].read_text() if files else ""

    try:
        wait_for(lambda: "step 20/" in rank_output(0), 60, "training")
        pid = re.search(r"rank 1/2 started: pid (\d+)", rank_output(1))
        assert pid is not None, rank_output(1)
        os.kill(int(pid.group(1)), signal.SIGKILL)
        code, _ = _exit_within(proc, SLACK_S + TIMEOUT_S)
    finally:
        kill_group(proc)
        proc.wait()
    assert code != 0


def test_one_ranks_device_error_ends_every_rank_with_it(tmp_path: Path) -> None:
    # Only rank 1 insists on CUDA (none here): rank 0 must not wait for it in the group,
    # both exit 2, rank 0 naming rank 1 and its reason.
    url = f"file://{tmp_path / 'rdzv'}"
    procs = []
    for rank, device in ((0, "auto"), (1, "cuda")):
        cmd = [*TRAINER, *FAST, "--device", device, "--init-method", url, "--rank", str(rank),
               "--world-size", "2", "--timeout", "60"]  # fmt: skip
        procs.append(
            subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=trainer_env(CUDA_VISIBLE_DEVICES=""),
            )
        )
    errors = []
    for proc in procs:
        code, _ = _exit_within(proc, 60)
        errors.append(proc.stderr.read() if proc.stderr else "")
        assert code == 2, errors[-1]
    assert "--device cuda: no CUDA device" in _one_line_error(errors[1])
    line = _one_line_error(errors[0])
    assert "rank 1 (" in line and "--device cuda: no CUDA device" in line, line
