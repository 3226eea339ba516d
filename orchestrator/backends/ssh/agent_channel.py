"""The exec channel that runs a node agent over SSH: writes that never raise, whether a write
would wait on any hop, and reads for a thread of its own or for the controller's one reader
(orchestrator.backends.readers)."""

from __future__ import annotations

import socket
import threading

import paramiko

from orchestrator.backends.base import writable
from orchestrator.backends.ssh.jumps import Jump

READ_BYTES = 1 << 16  # at most this much of one channel at a time, whoever else waits


class SshChannel:
    """An exec channel running the node agent."""

    def __init__(self, channel: paramiko.Channel, jump: Jump | None = None) -> None:
        self.channel = channel
        self.lock = threading.Lock()
        self.jump = jump
        # The last of what the agent printed on stderr, read as it came by read_waiting:
        # paramiko's descriptor for the channel is readable while either stream holds bytes.
        self.said = bytearray()

    def write(self, data: bytes) -> None:
        with self.lock:
            try:
                self.channel.sendall(data)
            except (OSError, EOFError, paramiko.SSHException):
                pass  # the agent or the connection is gone; the reader will see the end

    def ready(self) -> bool:
        """The channel's window is open and every hop's socket has room (a frozen or
        starved node stops reading its socket, and then a write to it waits); behind a
        ProxyCommand, the pipe to the command has room."""
        if not self.channel.send_ready():
            return False
        sock = self.channel.get_transport().sock
        while isinstance(sock, paramiko.Channel):  # through a jump host: its channel
            if not sock.send_ready():
                return False
            sock = sock.get_transport().sock
        if isinstance(sock, paramiko.ProxyCommand):
            return writable(sock.process.stdin)
        return not isinstance(sock, socket.socket) or writable(sock)

    def read(self, size: int) -> bytes:
        return self.channel.recv(size)

    def fileno(self) -> int:
        """A descriptor readable while the channel holds bytes or has ended (paramiko's
        pipe: two descriptors of the controller's per channel)."""
        return self.channel.fileno()

    def read_waiting(self) -> bytes | None:
        """The agent's output that has arrived, without waiting: b"" once it has ended,
        None when only stderr came (kept for errors) or nothing yet."""
        channel = self.channel
        while channel.recv_stderr_ready():
            self.said += channel.recv_stderr(READ_BYTES)
            del self.said[:-READ_BYTES]
        if channel.recv_ready():
            return channel.recv(READ_BYTES)
        if channel.eof_received or channel.closed:
            return b""
        return None

    def errors(self) -> str:
        chunks = [bytes(self.said)] if self.said else []
        try:
            while chunk := self.channel.recv_stderr(READ_BYTES):
                chunks.append(chunk)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        if not chunks and self.jump is not None and not self.jump.active:
            return f"the connection to jump host {self.jump.spec} was lost"
        return b"".join(chunks).decode(errors="replace")

    def hang_up(self) -> None:
        """Close our side for writing (the command reads the end of its stdin)."""
        try:
            self.channel.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass

    def ended(self) -> bool:
        """The command has exited, or the channel is closed."""
        return self.channel.exit_status_ready() or self.channel.closed

    def close(self) -> None:
        try:
            self.channel.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass
