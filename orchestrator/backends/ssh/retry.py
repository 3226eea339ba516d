"""Handshakes that fail for a moment, tried again.

An sshd past its MaxStartups (OpenSSH's default, 10:30:100, drops unauthenticated
connections beyond 10 at random) closes or resets a new connection before it sends its
identification; so does one that is restarting, and an overloaded one may not send it in
time. Such a failure is tried again after a pause that doubles from FIRST_PAUSE_S up to
LONGEST_PAUSE_S, jittered so that many nodes do not come back at the same moment: at most
TRIES tries in all (7.75 s of pauses at most), and no new try once WINDOW_S have passed
since the first. What another try cannot change is never retried: a refused key, an
unknown or changed host key, a name that does not resolve, a refused connection, no answer
within ConnectTimeout.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

import paramiko

TRIES = 6
FIRST_PAUSE_S = 0.25
LONGEST_PAUSE_S = 4.0
WINDOW_S = 60.0

T = TypeVar("T")


class Transient(Exception):
    """A handshake failure that another try may not meet; `str()` says what happened."""


def is_transient(exc: BaseException) -> bool:
    """Closed, reset or silent before the server's SSH identification, or closed while the
    keys were being exchanged."""
    if isinstance(exc, paramiko.SSHException):
        return str(exc).startswith("Error reading SSH protocol banner")
    return isinstance(exc, (ConnectionResetError, ConnectionAbortedError, EOFError))


def pause_s(attempt: int, draw: Callable[[], float] = random.random) -> float:
    """The pause after failed try number `attempt` (0 first): half the doubling step plus
    a random part of the other half."""
    step = min(LONGEST_PAUSE_S, FIRST_PAUSE_S * 2**attempt)
    return step * (0.5 + 0.5 * draw())


def with_retries(
    attempt: Callable[[], T],
    give_up: Callable[[Transient, int, float], Exception],
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`attempt()` until it returns or raises anything but `Transient`; after the last
    allowed try, raise `give_up(last failure, tries, seconds spent)`."""
    started = clock()
    tries = 0
    while True:
        try:
            return attempt()
        except Transient as exc:
            tries += 1
            spent = clock() - started
            if tries >= TRIES or spent >= WINDOW_S:
                raise give_up(exc, tries, spent) from None
            sleep(pause_s(tries - 1))
