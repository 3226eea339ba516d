"""Jump hosts (ProxyJump) shared by the nodes behind them.

A login node's sshd drops unauthenticated connections beyond its MaxStartups (OpenSSH's
default: 10), so one connection per node through it loses nodes from 12 on. Here the nodes
behind the same jump host (same user, address and port, reached through the same hops
before it) share one authenticated connection to it, and each node's connection is a
`direct-tcpip` channel through that one, as `ssh -J` with a ControlMaster does.

A jump host that could not be reached fails every node behind it with the same message,
tried once (with the handshake's own retries, retry.py), not once per node; the failure is
remembered for FAILURE_KEPT_S, then a later connection (a spare's probe) tries again. One
whose shared connection closed is connected again, once, by the first node that asks after
that; the nodes whose channel it took along try once more through the new one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import paramiko

from orchestrator.backends.ssh.client_config import Target
from orchestrator.backends.ssh.transport import close_client
from orchestrator.errors import NodeError

FAILURE_KEPT_S = 30.0

Key = tuple[tuple[str, str, int], ...]  # (user, address, port) of each hop, in order
# open(target, open_sock, shown) -> an authenticated client; open_sock() -> its socket
Opener = Callable[[Target, Callable[[], object | None], str], paramiko.SSHClient]


class JumpLost(NodeError):
    """The shared connection closed while a node was going through it."""


class Jump:
    """One shared, authenticated connection to a jump host; leased by the connections
    through it, closed when the last of them is."""

    def __init__(self, pool: Jumps, spec: str, target: Target, via: Jump | None):
        self.pool, self.spec, self.target, self.via = pool, spec, target, via
        self.client: paramiko.SSHClient | None = None
        self.users = 0
        self.lock = threading.Lock()
        self.failure: tuple[str, int] | None = None  # why it cannot be reached, exit code
        self.failed_at = 0.0

    @property
    def active(self) -> bool:
        transport = self.client.get_transport() if self.client is not None else None
        return transport is not None and transport.is_active()

    def lease(self) -> None:
        """Count one more user, connecting first if need be; raises a NodeError naming the
        jump host (the caller names its node)."""
        with self.lock:
            if self.failure is not None:
                if time.monotonic() - self.failed_at < FAILURE_KEPT_S:
                    message, code = self.failure
                    raise NodeError(f"jump host {self.spec}", message, exit_code=code)
                self.failure = None
            if self.client is not None and not self.active:
                self._close_client()  # closed under us: connect it again
            if self.client is None:
                self._connect()
            self.users += 1

    def _connect(self) -> None:
        via = self.via
        if via is not None:
            via.lease()
        shown = f"jump host {self.spec}"
        try:
            self.client = self.pool.open(
                self.target,
                (lambda: via.tunnel(self.target, shown)) if via is not None else (lambda: None),
                shown,
            )
        except NodeError as exc:
            if via is not None:
                via.release()
            self.failure, self.failed_at = (exc.message, exc.exit_code), time.monotonic()
            raise NodeError(shown, exc.message, exit_code=exc.exit_code) from None

    def tunnel(self, target: Target, shown: str) -> paramiko.Channel:
        """A channel to `target`'s SSH port through this jump host."""
        client = self.client
        transport = client.get_transport() if client is not None else None
        lost = JumpLost(shown, f"connection to jump host {self.spec} lost")
        if transport is None or not transport.is_active():
            raise lost
        try:
            return transport.open_channel(
                "direct-tcpip",
                (target.hostname, target.port),
                ("127.0.0.1", 0),
                timeout=target.connect_timeout,
            )
        except (OSError, EOFError, paramiko.SSHException) as exc:
            if not transport.is_active():
                raise lost from None
            raise NodeError(
                shown,
                f"jump host {self.spec} cannot reach {target.hostname}:{target.port}: {exc}",
            ) from None

    def release(self) -> None:
        """One user fewer; the last one closes the connection (and releases the hop before)."""
        with self.lock:
            self.users -= 1
            if self.users > 0 or self.client is None:
                return
            self._close_client()
        if self.via is not None:
            self.via.release()

    def _close_client(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            close_client(client)


class Jumps:
    """The jump hosts of one command, by the hops that lead to them."""

    def __init__(self, open: Opener) -> None:
        self.open = open
        self.lock = threading.Lock()
        self.jumps: dict[Key, Jump] = {}

    def lease(self, hops: list[tuple[str, Target]]) -> Jump:
        """The shared connection to the last of `hops` ((spec, target) in order), through
        the ones before it, leased once; raises NodeError naming the jump host."""
        key: Key = ()
        jump: Jump | None = None
        for spec, target in hops:
            key += ((target.user, target.hostname, target.port),)
            with self.lock:
                found = self.jumps.get(key)
                if found is None:
                    found = self.jumps[key] = Jump(self, spec, target, jump)
            jump = found
        assert jump is not None, "lease() needs at least one hop"
        jump.lease()
        return jump
