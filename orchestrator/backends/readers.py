"""One thread that reads every node agent's channel the kernel can wait on.

A reader thread per node costs the controller a thread (and its stack) per node, and at
hundreds of nodes most of its CPU goes to waking and scheduling them. A channel that has a
descriptor to wait on (`fileno()`: a local agent's pipe, paramiko's channel pipe) and a
read that never blocks (`read_waiting()`) is read here instead, by one thread waiting on all
of them at once (epoll). A channel without one (a test's, or one fed by another reader,
orchestrator.slurm.following.agents) keeps a thread of its own: NodeSession decides.

The thread is started with the first channel and lives as long as the controller; with no
channel to read it sleeps in the kernel.
"""

from __future__ import annotations

import select
import threading
from typing import Protocol


class Readable(Protocol):
    """What this reader needs of a session (orchestrator.backends.sessions.NodeSession)."""

    def read_here(self) -> bool:
        """Read what waits on the channel without blocking; False: read it no more."""


class Readers:
    """The controller's one reader of many channels."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.poller: select.epoll | None = None
        self.reading: dict[int, Readable] = {}  # descriptor -> its session
        self.thread: threading.Thread | None = None

    def add(self, fd: int, session: Readable) -> None:
        """Read `fd` for `session` from now on (its bytes may be waiting already)."""
        with self.lock:
            if self.poller is None:
                self.poller = select.epoll()
            self.reading[fd] = session
            try:
                self.poller.register(fd, select.EPOLLIN)
            except FileExistsError:  # still in the set: its last reader has not let it go
                self.poller.modify(fd, select.EPOLLIN)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="agent-readers", daemon=True)
                self.thread.start()

    def remove(self, fd: int, session: Readable) -> None:
        """Read `fd` no more for `session` (nothing if it no longer reads it)."""
        with self.lock:
            if self.reading.get(fd) is not session:
                return
            del self.reading[fd]
            try:
                self.poller.unregister(fd)  # type: ignore[union-attr]
            except (OSError, ValueError):
                pass  # closed already: the kernel dropped it from the set

    def _run(self) -> None:
        poller = self.poller
        assert poller is not None
        while True:
            for fd, _ in poller.poll():  # a signal's EINTR is retried by Python itself
                with self.lock:
                    session = self.reading.get(fd)
                if session is not None and not session.read_here():
                    self.remove(fd, session)


READERS = Readers()
