"""paramiko's transport as the controller runs it: the host key algorithms trust.py chose,
the fastest ciphers first, keepalives, and a reader thread that sleeps while nothing comes.

paramiko's reader thread wakes ten times a second per connection to look whether it should
stop (its socket timeout, 0.1 s); with 250 nodes that alone is 2 500 wake-ups a second on an
idle controller. Once connected, it waits up to IDLE_WAKE_S instead: data, or the other end
closing, still wake it at once, and `close_client` shuts the socket down first so that a
connection we close ends its thread at once too.
"""

from __future__ import annotations

import socket

import paramiko

# ServerAliveInterval when the ssh config sets none: keeps a NAT or firewall from dropping a
# quiet connection (liveness asks the node's sshd itself when its agent falls silent).
KEEPALIVE_S = 15
IDLE_WAKE_S = 15.0
# Tried first when the server offers them: paramiko decrypts AES-GCM at about three times
# the speed of its default AES-CTR + HMAC-SHA2 (the controller reads every rank's output).
AEAD_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


class _Transport(paramiko.Transport):
    """paramiko's transport offering the host key algorithms trust.py ordered, certificates
    included (paramiko parses them; trust.py checks them)."""

    host_key_algorithms: tuple[str, ...] = ()

    @property
    def preferred_keys(self) -> tuple[str, ...]:
        return tuple(a for a in self.host_key_algorithms if a in self._key_info)


def new_transport(algorithms: tuple[str, ...], *args, **kwargs) -> paramiko.Transport:
    transport = _Transport(*args, **kwargs)
    transport.host_key_algorithms = algorithms
    options = transport.get_security_options()
    known = options.ciphers
    options.ciphers = tuple(c for c in AEAD_CIPHERS if c in known) + tuple(
        c for c in known if c not in AEAD_CIPHERS
    )
    return transport


def settle(client: paramiko.SSHClient, keepalive_s: float | None) -> None:
    """After the handshake: keepalives (ssh's ServerAliveInterval), and a reader thread
    that no longer polls."""
    transport = client.get_transport()
    transport.set_keepalive(KEEPALIVE_S if keepalive_s is None else int(keepalive_s))
    transport.sock.settimeout(IDLE_WAKE_S)


def close_client(client: paramiko.SSHClient) -> None:
    """Close a connection; its reader thread ends at once (see the module docstring)."""
    transport = client.get_transport()
    sock = transport.sock if transport is not None else None
    if isinstance(sock, socket.socket):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    try:
        client.close()
    except Exception:  # closing must never hide the real outcome
        pass
