"""Connections to nodes over SSH (paramiko), decided as `ssh NODE` would decide them.

client_config.py resolves each host as `ssh -G` would; trust.py judges its host key as ssh's
known_hosts checks would; identities.py logs in with the keys ssh would offer; this module
opens the connections (through jump hosts shared by the nodes behind them, jumps.py, or a
ProxyCommand), tries a handshake again when it failed for a moment (retry.py), and turns
every failure into a NodeError naming the host.
"""

from __future__ import annotations

import errno
import logging
import os
import shlex
import socket
import struct
from collections.abc import Callable

import paramiko

from orchestrator.agent import agent_argv
from orchestrator.backends.base import (
    MISSING_PYTHON_WORDS,
    IdleAgent,
)
from orchestrator.backends.ssh.agent_channel import SshChannel
from orchestrator.backends.ssh.client_config import SshConfig, Target, resolve
from orchestrator.backends.ssh.identities import OfferedKeys
from orchestrator.backends.ssh.jumps import Jump, JumpLost, Jumps
from orchestrator.backends.ssh.retry import Transient, is_transient, with_retries
from orchestrator.backends.ssh.sftp import put_tree
from orchestrator.backends.ssh.transport import close_client, new_transport, settle
from orchestrator.backends.ssh.trust import HostKeyRefused, Trust
from orchestrator.errors import ConfigError, NodeError
from orchestrator.hosts.hostfile import Host
from orchestrator.numerals import PORT, NumberError, whole_number
from orchestrator.options.reaching import SshOptions

# paramiko logs a failed handshake (`Exception (client): ...` and a traceback) as records
# that Python would print raw on stderr; what they mean reaches the user as our NodeError,
# and `orchestrator --verbose` shows the records themselves.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
# A node that let us log in is there; its sshd may take long to start a session when the
# node (or, in a lab, the one machine under every node) is loaded: 250 at once on 2 cores
# took more than 10 s for some.
SESSION_OPEN_TIMEOUT_S = 120.0
# Linux's struct tcp_info (linux/tcp.h): tcpi_unacked at byte 24, tcpi_last_ack_recv (ms) at 56
# (52 is tcpi_last_data_recv: a silent agent's silence, not the kernel's).
TCP_INFO_FIELDS = struct.Struct("=24xI28xI")


class SshSession:
    """What the connections of one command share: options, the ssh config, trust."""

    def __init__(self, options: SshOptions | None = None) -> None:
        self.options = options or SshOptions()
        self.config = SshConfig(self.options.ssh_config)
        self.trust = Trust()
        self.jumps = Jumps(
            lambda target, open_sock, shown: _handshake(target, self, open_sock, shown)
        )

    def resolve(self, host: Host) -> Target:
        return resolve(host.name, self.config, self.options, user=host.user, port=host.port)

    def connect(self, host: Host) -> SshConnection:
        return connect(host, self)

    def report(self) -> None:
        """Say which hosts were let in without a verified key (StrictHostKeyChecking no)."""
        self.trust.report()


class SshConnection:
    """One node over SSH (through the shared connection to its jump host, if any)."""

    def __init__(
        self, host: str, target: Target, client: paramiko.SSHClient, jump: Jump | None
    ) -> None:
        self.host = host
        self.target = target
        self.client = client
        self.jump = jump
        direct = jump is None and not target.proxy_command
        peer = client.get_transport().getpeername()[0] if direct else target.hostname
        self.address = peer
        self.idle_agent: IdleAgent | None = None

    def start_agent(self, python: str, tag: str) -> SshChannel:
        command = (
            f"command -v {shlex.quote(python)} >/dev/null 2>&1 || "
            f'{{ echo "python {shlex.quote(python)} {MISSING_PYTHON_WORDS}" >&2; '
            "exit 127; }; "
            f"ORCHESTRATOR_RUN_ID={shlex.quote(tag)} exec {shlex.join(agent_argv(python, tag))}"
        )
        try:
            channel = self.client.get_transport().open_session(timeout=SESSION_OPEN_TIMEOUT_S)
            channel.exec_command(command)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise NodeError(self.host, f"cannot start the node agent: {exc}") from None
        return SshChannel(channel, self.jump)

    def answers(self) -> bool:
        """An SSH keepalive that the node's sshd must answer (as ssh's ServerAliveInterval
        sends): True once it does, False when the connection is gone. Blocks meanwhile."""
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            return False
        try:
            # sshd answers an unknown request with a failure: an answer all the same.
            transport.global_request("keepalive@openssh.com", wait=True)
        except (OSError, EOFError, paramiko.SSHException):
            return False
        return transport.is_active()

    def acknowledged(self, within: float) -> bool | None:
        """The node's kernel acknowledged every segment in flight, or some segment within
        `within` s (tcp_info; the controller's heartbeats keep segments going out), on a
        direct connection; None through a hop (base.NodeConnection)."""
        transport = self.client.get_transport()
        sock = transport.sock if transport is not None else None
        acks = tcp_acks(sock) if isinstance(sock, socket.socket) else None
        if acks is None:
            return None
        unacked, since_ack = acks
        return unacked == 0 or since_ack < within

    def put_tree(self, local_dir: str, remote_dir: str) -> int:
        """Copy a directory tree to the node over SFTP; returns the number of files."""
        return put_tree(self.client, local_dir, remote_dir)

    def close(self) -> None:
        if self.idle_agent is not None:
            self.idle_agent.channel.close()
            self.idle_agent = None
        close_client(self.client)
        jump, self.jump = self.jump, None
        if jump is not None:
            jump.release()


def tcp_acks(sock: socket.socket) -> tuple[int, float] | None:
    """(segments in flight not yet acknowledged, seconds since the peer's kernel last
    acknowledged one) of a TCP socket, from Linux's tcp_info; None elsewhere."""
    if not hasattr(socket, "TCP_INFO"):
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_FIELDS.size)
        unacked, last_ack_ms = TCP_INFO_FIELDS.unpack_from(info)
    except (OSError, struct.error):
        return None
    return unacked, last_ack_ms / 1000


class _TrustPolicy(paramiko.MissingHostKeyPolicy):
    """Called for every host key (none is preloaded into paramiko): trust.py decides."""

    def __init__(self, trust: Trust, target: Target, shown: str, direct: bool) -> None:
        self.trust, self.target, self.shown, self.direct = trust, target, shown, direct

    def missing_host_key(self, client, hostname, key) -> None:
        address = client.get_transport().getpeername()[0] if self.direct else None
        self.trust.check(self.target, self.shown, key, address)


def _open_client(
    target: Target, session: SshSession, sock: object | None, shown: str
) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    trust = session.trust
    client.set_missing_host_key_policy(_TrustPolicy(trust, target, shown, sock is None))
    where = f"{target.hostname}:{target.port}"
    timeout = target.connect_timeout
    algorithms = trust.algorithms(target)
    try:
        client.connect(
            target.hostname,
            port=target.port,
            username=target.user,
            # The keys ssh would offer, certificates included, in its order.
            auth_strategy=OfferedKeys(target),
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            sock=sock,
            transport_factory=lambda *a, **kw: new_transport(algorithms, *a, **kw),
        )
    except HostKeyRefused as exc:
        client.close()
        raise _refused(shown, target, exc) from None
    except paramiko.AuthenticationException as exc:
        client.close()
        raise _authentication_failed(shown, target, where, exc) from None
    except socket.gaierror:
        client.close()
        raise NodeError(
            shown,
            f"cannot resolve host name {target.hostname!r}; check the hostfile and the ssh config",
            exit_code=2,
        ) from None
    except TimeoutError:
        client.close()
        raise NodeError(
            shown,
            f"no answer from {where} within {timeout:g} s (node down, or unreachable from here?)",
        ) from None
    except paramiko.ssh_exception.NoValidConnectionsError as exc:
        client.close()
        codes = {getattr(e, "errno", None) for e in exc.errors.values()}
        if codes == {errno.ECONNREFUSED}:
            raise NodeError(
                shown,
                f"connection refused at {where} (is sshd running there, and is the port right?)",
            ) from None
        reasons = "; ".join(
            sorted(
                {
                    os.strerror(e.errno) if getattr(e, "errno", None) else str(e)
                    for e in exc.errors.values()
                }
            )
        )
        raise NodeError(
            shown, f"cannot connect to {where}: {reasons} (node down, or unreachable from here?)"
        ) from None
    except (OSError, EOFError, paramiko.SSHException) as exc:
        client.close()
        if is_transient(exc):
            raise Transient(_closed_early(exc)) from None
        raise NodeError(shown, f"cannot connect to {where}: {exc}") from None
    settle(client, target.keepalive_s)
    return client


def _refused(shown: str, target: Target, exc: HostKeyRefused) -> NodeError:
    files = (
        " or ".join(target.trust.user_files + target.trust.global_files)
        or "any known_hosts file (UserKnownHostsFile none)"
    )
    key = f"{exc.key.get_name()} {exc.key.fingerprint}"
    if exc.reason == "revoked":
        message = (
            f"host key of {exc.name} is REVOKED ({key} is listed @revoked in {files}); "
            "refusing to connect"
        )
    elif exc.reason == "changed":
        first = target.trust.user_files[0] if target.trust.user_files else ""
        message = (
            f"host key of {exc.name} has CHANGED (now {key}; {exc.detail} lists "
            "another): the node was reinstalled, or someone is in between. If you "
            "trust the change, remove the old key (ssh-keygen -R "
            f"{shlex.quote(exc.name)} -f {shlex.quote(first)}) and connect again"
        )
    else:
        message = (
            f"host key of {exc.name} is not in {files} ({key}); check it and add it "
            "(e.g. ssh once, or ssh-keygen -s / @cert-authority for a CA), or rerun "
            "with --accept-new-host-keys to accept and record unknown keys"
        )
    return NodeError(shown, message, exit_code=2)


def _authentication_failed(shown: str, target: Target, where: str, exc: Exception) -> NodeError:
    # An ssh config's IdentityFile that is not there is skipped, as ssh skips it (--identity
    # files were checked when given); a typo in one is then the likely cause: named.
    missing = [path for path in target.identity_files if not os.path.isfile(path)]
    skipped = f"; IdentityFile {', '.join(missing)} does not exist" if missing else ""
    return NodeError(
        shown,
        f"authentication failed as {target.user}@{where} ({exc}){skipped}; "
        "check the user (hostfile user=, ssh config User) and that your key "
        "is in the ssh-agent, a default key, or an IdentityFile (a certificate: "
        "CertificateFile, or KEY-cert.pub beside it)",
        exit_code=2,
    )


def _closed_early(exc: BaseException) -> str:
    if isinstance(exc, paramiko.SSHException):
        detail = str(exc).removeprefix("Error reading SSH protocol banner").strip()
        return "closed before its SSH identification" + (f" ({detail})" if detail else "")
    return f"closed during the handshake ({exc or type(exc).__name__})"


def _handshake(
    target: Target, session: SshSession, open_sock: Callable[[], object | None], shown: str
) -> paramiko.SSHClient:
    """An authenticated client for `target`, over a fresh `open_sock()` each try; a
    handshake that failed for a moment is tried again (retry.py)."""
    where = f"{target.hostname}:{target.port}"

    def give_up(last: Transient, tries: int, spent: float) -> NodeError:
        return NodeError(
            shown,
            f"cannot connect to {where}: the connection was {last} on each of {tries} tries "
            f"over {spent:.0f} s (its sshd past its MaxStartups, or restarting?)",
        )

    return with_retries(lambda: _open_client(target, session, open_sock(), shown), give_up)


def connect(host: Host, session: SshSession) -> SshConnection:
    """Connect to one host, through its (shared) jump hosts if any."""
    target = session.resolve(host)
    jumps = target.proxy_jump.split(",") if target.proxy_jump else []
    hops = [(spec, _hop_target(spec, session)) for spec in jumps]
    jump = _lease(session, hops, host.name) if hops else None

    def open_sock() -> object | None:
        nonlocal jump
        if jump is not None:
            try:
                return jump.tunnel(target, host.name)
            except JumpLost:  # connected again by the first node to ask
                spec = jump.spec
                jump.release()
                jump = None
                jump = _lease(session, hops, host.name)
                raise Transient(f"cut when the connection to jump host {spec} closed") from None
        if target.proxy_command:
            return paramiko.ProxyCommand(target.proxy_command)
        return None

    try:
        client = _handshake(target, session, open_sock, host.name)
    except BaseException:
        if jump is not None:
            jump.release()
        raise
    return SshConnection(host.name, target, client, jump)


def _lease(session: SshSession, hops: list[tuple[str, Target]], shown: str) -> Jump:
    try:
        return session.jumps.lease(hops)
    except NodeError as exc:  # the same words for every node behind it: the errors fold
        raise NodeError(shown, f"{exc.host}: {exc.message}", exit_code=exc.exit_code) from None


def _hop_target(jump: str, session: SshSession) -> Target:
    user, _, rest = jump.rpartition("@")
    name, colon, port = rest.partition(":")
    try:
        number = whole_number(port, f"the port of ProxyJump {jump}", *PORT) if colon else None
    except NumberError as exc:
        raise ConfigError(f"{exc} (ssh config ProxyJump)") from None
    return session.resolve(Host(name=name, user=user or None, port=number))
