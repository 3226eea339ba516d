"""What wakes a quiet agent: a write in the node directory, a signal, a child's end.

Ranks write their output, metrics and exit records to files in the node directory
(ranks.py), and files give no sign when they grow. Polled, a quiet agent wakes ten times a
second to find nothing: at one node that is a quarter of a percent of a core, but it is per
node, and where many nodes start at once on shared cores (or a node runs many agents) it
is CPU taken from the torch imports the start waits for. So on Linux the agent asks the
kernel (inotify, through ctypes) to report writes in the node directory, and a signal
(`signal.set_wakeup_fd`, SIGCHLD included) to write a byte to a pipe; both are file
descriptors its `select` waits on, and a quiet agent sleeps up to QUIET_S between passes.

Where the kernel gives no watch (not Linux, no ctypes, or the user's inotify instances all
taken: `fs.inotify.max_user_instances`, 128 by default), the agent polls as before: same
output, more wake-ups. Standard library only: this module runs on the nodes too (see
orchestrator.agent.bootstrap).
"""

from __future__ import annotations

import os
import signal

# Quiet with a watch: the longest sleep between passes (and at most a quarter of the
# heartbeat timeout). What no descriptor reports (the free-space check, due every 5 s; a
# silent controller) waits at most this long, as would output on a file system whose writes
# the watch missed; the heartbeat and sample threads write their frames themselves.
QUIET_S = 5.0
# inotify(7): a file in the directory modified or closed after writing, or one created or
# moved in (rank-N.out, metrics-N.jsonl, rank-N.exit).
IN_MODIFY, IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x2, 0x8, 0x80, 0x100
WATCHED = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE
READ_SIZE = 1 << 16


def watch_directory(directory: str) -> int | None:
    """A non-blocking inotify descriptor reporting writes in `directory`, or None."""
    try:
        import ctypes  # only where a watch is wanted: importing it costs ~4 ms

        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    except (ImportError, OSError, AttributeError):  # no ctypes, no libc, not Linux
        return None
    if fd < 0:
        return None
    if libc.inotify_add_watch(fd, os.fsencode(directory), WATCHED) < 0:
        os.close(fd)
        return None
    return fd


def drain(fd: int) -> None:
    """Read every pending byte of a non-blocking descriptor."""
    while True:
        try:
            if not os.read(fd, READ_SIZE):
                return
        except OSError:  # BlockingIOError: nothing (more) pending
            return


class Wakeup:
    """The descriptors a quiet agent's select waits on, from its creation to `close()`.

    `files` is the node directory's watch (None: poll); `signals` the read end of the pipe
    every signal writes to. Call `drain_files()` before reading the files, so that a write
    after that read leaves an event for the next select."""

    def __init__(self, directory: str | None) -> None:
        self.files = watch_directory(directory) if directory else None
        self.signals, self._write = os.pipe()
        for fd in (self.signals, self._write):
            os.set_blocking(fd, False)
        self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        # A handler (not SIG_DFL, which discards it) so that a child's end reaches the pipe.
        self._previous_chld = signal.signal(signal.SIGCHLD, lambda *_: None)

    def descriptors(self, quiet: bool) -> list[int]:
        """What to select on: the signal pipe always, the watch while quiet (while busy the
        loop polls at its own pace, and a chatty rank must not wake it at every write)."""
        if quiet and self.files is not None:
            return [self.signals, self.files]
        return [self.signals]

    def drain_files(self) -> None:
        if self.files is not None:
            drain(self.files)

    def close(self) -> None:
        signal.signal(signal.SIGCHLD, self._previous_chld)
        signal.set_wakeup_fd(self._previous_fd)
        for fd in (self.signals, self._write, self.files):
            if fd is not None:
                os.close(fd)
        self.files = None
