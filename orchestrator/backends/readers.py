"""One thread that reads every node agent's channel the kernel can wait on.

A reader thread per node costs the controller a thread (and its stack) per node, and at
hundreds of nodes most of its CPU goes to waking and scheduling them. A channel that has a
descriptor to wait on (`fileno()`: a local agent's pipe, paramiko's channel pipe) and a
read that never blocks (`read_waiting()`) is read here instead, by one thread waiting on all
of them at once (epoll). A channel without one (a test's, or one fed by another reader,
orchestrator.slurm.following.agents) keeps a thread of its own: NodeSession decides.

The thread is started with the first channel and lives as long as the controller; with no
channel to read it sleeps in the kernel. Its rounds come at most every READ_GAP_S: after one,
it sleeps the rest of that, and what came on every channel meanwhile is read in the next. At
1 000 nodes of ranks printing a line a second, a round per frame woke the thread (and the
loop it hands to) 8 000 times a second.
"""

from __future__ import annotations

import select
import threading
import time
from typing import Protocol

READ_GAP_S = 0.005  # between the starts of two rounds: a frame read 5 ms later at most


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
            ready = poller.poll()  # a signal's EINTR is retried by Python itself
            began = time.monotonic()
            for fd, _ in ready:
                with self.lock:
                    session = self.reading.get(fd)
                if session is not None and not session.read_here():
                    self.remove(fd, session)
            rest = began + READ_GAP_S - time.monotonic()
            if rest > 0:
                time.sleep(rest)


READERS = Readers()
