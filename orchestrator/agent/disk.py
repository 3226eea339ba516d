"""The node's disk: can the run still write its files here, and if not, why.

A rank writes its output and its exit to the node directory (rank-N.out, rank-N.exit). When
that file system is full, over quota, read-only or failing, the rank's own error goes to the
file it cannot write, and all that is left is an exit code. So the agent asks the directory
itself, with a small write, after anything fails there; a fault found is reported as a W
frame (protocol.py) before the failure it explains.

Standard library only: this module runs on the nodes too (see orchestrator.agent.bootstrap).
"""

from __future__ import annotations

import errno
import os
import time

from orchestrator.agent.protocol import Frame

# Type names only, not imported at run time (see processes.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from orchestrator.agent.shipping import Outbox

# What a write can fail with that is the node's fault, not the job's.
WRITE_FAULTS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS}
PROBE_BYTES = 4096  # one page: a file system with less free cannot take a line of output
CHECK_S = 5.0  # while ranks run: how often to look at the free space (one statvfs)


def write_fault(directory: str) -> OSError | None:
    """The error a small write in `directory` fails with, if it is a disk fault."""
    path = os.path.join(directory, f".write-probe-{os.getpid()}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"\0" * PROBE_BYTES)
            os.fsync(fd)  # quota and I/O errors of network file systems show here
        finally:
            os.close(fd)
    except OSError as exc:
        return exc if exc.errno in WRITE_FAULTS else None
    finally:
        try:
            os.remove(path)
        except OSError:
            pass
    return None


def looks_full(directory: str) -> bool:
    """Less than a page free for this user: cheap enough to ask every few seconds."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize < PROBE_BYTES


def is_fault(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in WRITE_FAULTS


class DiskWatch:
    """Reports a disk fault of the node directory to the controller, once per step."""

    def __init__(self, directory: str | None, shown_as: str | None, outbox: Outbox) -> None:
        self.directory = directory
        self.shown_as = shown_as or directory or ""  # as the user wrote it (~/...)
        self.outbox = outbox
        self.reported = False
        self.next_check = 0.0

    def report(self, exc: OSError) -> None:
        if not self.reported:
            self.reported = True
            name = errno.errorcode.get(exc.errno or 0, "EIO")
            payload = self.shown_as.encode()
            self.outbox.send_masked(Frame.DISK_FAULT, name, f"{time.time():.6f}", payload=payload)

    def probe(self) -> bool:
        """Write here now; report a fault found. True if there is one (now or before)."""
        if self.directory and not self.reported:
            fault = write_fault(self.directory)
            if fault is not None:
                self.report(fault)
        return self.reported

    def tick(self, now: float) -> None:
        """While the step runs: a full file system is probed (and reported) at once."""
        if self.directory is None or self.reported or now < self.next_check:
            return
        self.next_check = now + CHECK_S
        if looks_full(self.directory):
            self.probe()
