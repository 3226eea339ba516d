"""`orchestrator check` stopped by a signal: the package's one `Interrupted` (so `except
orchestrator.Interrupted` catches it), exit code 128 + the signal's number. A real agent on
this machine runs the step; the signal goes to this process, as Ctrl-C or `kill` would."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

import orchestrator
from orchestrator.backends.local import LocalConnection
from orchestrator.check.gather import run_each


def signal_once_handled(signum: int, original, sent: list[int]) -> None:
    """Send `signum` to this process once the check's handler has replaced `original`."""
    deadline = time.monotonic() + 20
    while signal.getsignal(signum) is original and time.monotonic() < deadline:
        time.sleep(0.01)
    if signal.getsignal(signum) is not original:  # never the test runner's own handler
        time.sleep(0.3)  # the agent's command is under way
        sent.append(signum)
        os.kill(os.getpid(), signum)


@pytest.mark.parametrize(("signum", "exit_code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_ends_the_check_as_interrupted(signum: int, exit_code: int) -> None:
    connection = LocalConnection("localhost")
    sent: list[int] = []
    sender = threading.Thread(
        target=signal_once_handled, args=(signum, signal.getsignal(signum), sent)
    )
    sender.start()
    try:
        with pytest.raises(orchestrator.Interrupted) as raised:
            run_each([connection], [sys.executable], {0: ["sleep", "30"]}, 60.0, "check-signal")
    finally:
        sender.join()
        connection.close()
    assert sent == [signum]
    assert raised.value.exit_code == exit_code and raised.value.signum == signum
    assert str(raised.value).startswith(signal.Signals(signum).name)
