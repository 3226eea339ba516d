"""Log shipping: what the run writes on the node, as whole lines and masked, to the controller.

Ranks write to files on the node (rank-N.out, by the script's run_rank) and never block on
the network; the agent tails those files and the node script's own pipe (torchrun's output),
cuts them into whole lines, masks secrets, and queues frames in an `Outbox` that it writes to
stdout without blocking. A rank's exit (rank-N.exit) is sent only after all its output.

Standard library only: this module runs on the nodes too (see orchestrator.agent.bootstrap).
"""

from __future__ import annotations

import os
import select
import threading
import time

from orchestrator.agent.protocol import Frame, frame

# Type names only, not imported at run time (see processes.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO

READ_CHUNK = 1 << 20
MAX_PENDING_OUT = 8 << 20  # stop reading rank files while this much waits for the controller


def mask(data: bytes, secrets: list[bytes]) -> bytes:
    for secret in secrets:
        data = data.replace(secret, b"***")
    return data


class Outbox:
    """Frames waiting for the controller, written to `fd` whenever it can take them."""

    def __init__(self, secrets: list[str], fd: int = 1) -> None:
        self.secrets = [s.encode() for s in secrets if s]
        self.fd = fd
        self.data = bytearray()
        self.open = True  # False once the controller is gone: nothing more is kept
        self.outputs = 0  # how many O frames so far: the agent polls faster while they come
        self.wrote_at = 0.0  # when bytes last went out (monotonic): a steady beat waits on it
        # The heartbeat thread sends and writes too: frames go in and out whole.
        self.lock = threading.Lock()

    def send(self, data: bytes) -> None:
        with self.lock:
            if self.open:
                self.data += data

    def send_masked(self, kind: Frame, *fields: object, payload: bytes) -> None:
        self.send(frame(kind, *fields, payload=mask(payload, self.secrets)))

    def message(self, text: str) -> None:
        self.send_masked(Frame.MESSAGE, payload=text.encode())

    def output(self, rank: int, data: bytes) -> None:
        if data:
            self.outputs += 1
            self.send_masked(Frame.RANK_OUTPUT, rank, payload=data)

    def metrics(self, rank: int, data: bytes) -> None:
        """Whole lines of a rank's metrics channel (masked: a program may log anything)."""
        if data:
            self.outputs += 1
            self.send_masked(Frame.METRICS, rank, payload=data)

    def write_some(self) -> None:
        with self.lock:
            try:
                written = os.write(self.fd, self.data[:READ_CHUNK])
            except BlockingIOError:
                return
            except OSError:  # the controller is gone; nobody to tell
                self.open = False
                self.data.clear()
                return
            del self.data[:written]
            if written:
                self.wrote_at = time.monotonic()

    def flush(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while self.data and self.open:
            left = end - time.monotonic()
            if left <= 0:
                return
            _, writable, _ = select.select([], [self.fd], [], left)
            if writable:
                self.write_some()


class PipeLines:
    """The node script's own output (torchrun's), from its pipe, cut into whole lines."""

    def __init__(self, pipe: BinaryIO) -> None:
        self.pipe: BinaryIO | None = pipe
        self.partial = b""
        os.set_blocking(pipe.fileno(), False)

    def read_lines(self) -> bytes:
        """Whole lines read now; at the end, the last one even without its newline."""
        assert self.pipe is not None
        try:
            chunk = os.read(self.pipe.fileno(), READ_CHUNK)
        except BlockingIOError:
            return b""
        if not chunk:  # the script and everything holding its stdout are done
            self.pipe.close()
            self.pipe = None
            chunk = b"\n" if self.partial else b""
        data = self.partial + chunk
        cut = data.rfind(b"\n") + 1
        self.partial = data[cut:]
        return data[:cut]
