"""Which handshake failures are tried again, how often and after what pauses (retry.py);
the real drop by an sshd past its MaxStartups is in tests/cluster/test_jump_cluster.py."""

from __future__ import annotations

import socket

import paramiko
import pytest

from orchestrator.backends.ssh import retry
from orchestrator.backends.ssh.retry import Transient, is_transient, pause_s, with_retries


@pytest.mark.parametrize(
    ("failure", "transient"),
    [
        (paramiko.SSHException("Error reading SSH protocol banner"), True),
        (paramiko.SSHException("Error reading SSH protocol banner[Errno 104] reset"), True),
        (ConnectionResetError(104, "Connection reset by peer"), True),
        (EOFError(), True),
        (paramiko.AuthenticationException("Authentication failed."), False),
        (paramiko.SSHException("Signature verification (ssh-ed25519) failed."), False),
        (paramiko.SSHException("Incompatible ssh peer (no acceptable kex algorithm)"), False),
        (socket.gaierror(-2, "Name or service not known"), False),
        (ConnectionRefusedError(111, "Connection refused"), False),
        (TimeoutError("timed out"), False),
    ],
)
def test_only_a_connection_closed_early_is_transient(failure: Exception, transient: bool) -> None:
    assert is_transient(failure) is transient


def test_pauses_double_up_to_the_longest_and_are_jittered() -> None:
    lows = [pause_s(n, lambda: 0.0) for n in range(8)]
    highs = [pause_s(n, lambda: 1.0) for n in range(8)]
    assert lows == [0.125, 0.25, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0]
    assert highs == [0.25, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    assert sum(highs[: retry.TRIES - 1]) == 7.75  # what the module docstring promises


def test_a_transient_failure_is_tried_again_until_it_succeeds() -> None:
    slept: list[float] = []
    outcomes = iter([Transient("closed"), Transient("closed"), "connected"])

    def attempt() -> str:
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert with_retries(attempt, lambda *a: AssertionError(a), sleep=slept.append) == "connected"
    assert len(slept) == 2 and 0.125 <= slept[0] <= 0.25 and 0.25 <= slept[1] <= 0.5


def test_it_gives_up_after_the_last_try_and_says_how_many() -> None:
    tries = []

    def attempt() -> None:
        tries.append(1)
        raise Transient("closed before its SSH identification")

    with pytest.raises(RuntimeError, match=r"6 tries: closed before its SSH identification"):
        with_retries(
            attempt, lambda last, n, s: RuntimeError(f"{n} tries: {last}"), sleep=lambda s: None
        )
    assert len(tries) == retry.TRIES


def test_no_new_try_once_the_window_has_passed() -> None:
    now = [0.0]

    def attempt() -> None:
        now[0] += retry.WINDOW_S  # one very slow try (a banner timeout)
        raise Transient("silent")

    with pytest.raises(RuntimeError, match="1 tries"):
        with_retries(
            attempt,
            lambda last, n, s: RuntimeError(f"{n} tries"),
            sleep=lambda s: None,
            clock=lambda: now[0],
        )


def test_anything_else_is_raised_at_once() -> None:
    tries = []

    def attempt() -> None:
        tries.append(1)
        raise ValueError("a refused key")

    with pytest.raises(ValueError):
        with_retries(attempt, lambda *a: AssertionError(a), sleep=lambda s: None)
    assert tries == [1]
