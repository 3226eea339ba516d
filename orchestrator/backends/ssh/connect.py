"""Connections to nodes over SSH (paramiko), decided as `ssh NODE` would decide them.

config.py resolves each host as `ssh -G` would; trust.py judges its host key as ssh's
known_hosts checks would; identities.py logs in with the keys ssh would offer; this module
opens the connections (through ProxyJump hops or a ProxyCommand), in parallel, and turns
every failure into a NodeError naming the host.
"""

from __future__ import annotations

import errno
import os
import shlex
import socket
import stat
import threading

import paramiko

from orchestrator.agent import agent_argv
from orchestrator.backends.base import (
    DEFAULT_CONNECT_TIMEOUT_S,
    MISSING_PYTHON_WORDS,
    IdleAgent,
    SshOptions,
)
from orchestrator.backends.ssh.config import SshConfig, Target, resolve
from orchestrator.backends.ssh.identities import OfferedKeys
from orchestrator.backends.ssh.trust import HostKeyRefused, Trust
from orchestrator.errors import NodeError
from orchestrator.hostfile import Host

KEEPALIVE_S = 5
# Tried first when the server offers them: paramiko decrypts AES-GCM at about three times
# the speed of its default AES-CTR + HMAC-SHA2 (the controller reads every rank's output).
AEAD_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


class SshSession:
    """What the connections of one command share: options, the ssh config, trust."""

    def __init__(self, options: SshOptions | None = None) -> None:
        self.options = options or SshOptions()
        self.config = SshConfig(self.options.config_path)
        self.trust = Trust()

    def resolve(self, host: Host) -> Target:
        return resolve(host.name, self.config, self.options, user=host.user, port=host.port)

    def connect(self, host: Host) -> SshConnection:
        return connect(host, self)

    def report(self) -> None:
        """Say which hosts were let in without a verified key (StrictHostKeyChecking no)."""
        self.trust.report()


class SshChannel:
    """An exec channel running the node agent."""

    def __init__(self, channel: paramiko.Channel) -> None:
        self.channel = channel
        self.lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self.lock:
            try:
                self.channel.sendall(data)
            except (OSError, EOFError, paramiko.SSHException):
                pass  # the agent or the connection is gone; the reader will see the end

    def read(self, size: int) -> bytes:
        return self.channel.recv(size)

    def errors(self) -> str:
        chunks = []
        try:
            while chunk := self.channel.recv_stderr(65536):
                chunks.append(chunk)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        return b"".join(chunks).decode(errors="replace")

    def close(self) -> None:
        try:
            self.channel.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass


class SshConnection:
    """One node over SSH (plus the jump hosts it goes through)."""

    def __init__(
        self, host: str, target: Target, client: paramiko.SSHClient, hops: list[paramiko.SSHClient]
    ) -> None:
        self.host = host
        self.target = target
        self.client = client
        self.hops = hops
        direct = not hops and not target.proxy_command
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
            channel = self.client.get_transport().open_session(timeout=DEFAULT_CONNECT_TIMEOUT_S)
            channel.exec_command(command)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise NodeError(self.host, f"cannot start the node agent: {exc}") from None
        return SshChannel(channel)

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

    def put_tree(self, local_dir: str, remote_dir: str) -> int:
        """Copy a directory tree to the node over SFTP; returns the number of files."""
        copied = 0
        with self.client.open_sftp() as sftp:
            remote_root = _sftp_path(sftp, remote_dir)
            _sftp_makedirs(sftp, remote_root)
            for root, dirs, files in os.walk(local_dir):
                rel = os.path.relpath(root, local_dir)
                target = remote_root if rel == "." else f"{remote_root}/{rel}"
                for name in dirs:
                    _sftp_makedirs(sftp, f"{target}/{name}")
                for name in files:
                    source = os.path.join(root, name)
                    sftp.put(source, f"{target}/{name}")
                    sftp.chmod(f"{target}/{name}", stat.S_IMODE(os.stat(source).st_mode))
                    copied += 1
        return copied

    def close(self) -> None:
        if self.idle_agent is not None:
            self.idle_agent.channel.close()
            self.idle_agent = None
        for client in [self.client, *reversed(self.hops)]:
            try:
                client.close()
            except Exception:  # closing must never hide the real outcome
                pass


def _sftp_path(sftp: paramiko.SFTPClient, path: str) -> str:
    if path.startswith("~/"):
        return f"{sftp.normalize('.')}/{path[2:]}"
    return path


def _sftp_makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    parts = path.split("/")
    for end in range(1, len(parts) + 1):
        partial = "/".join(parts[:end])
        if not partial:
            continue
        try:
            sftp.stat(partial)
        except FileNotFoundError:
            sftp.mkdir(partial, mode=0o700)


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
            transport_factory=lambda *a, **kw: _transport(algorithms, *a, **kw),
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
        raise NodeError(shown, f"cannot connect to {where}: {exc}") from None
    keepalive = KEEPALIVE_S if target.keepalive_s is None else int(target.keepalive_s)
    client.get_transport().set_keepalive(keepalive)
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
    return NodeError(
        shown,
        f"authentication failed as {target.user}@{where} ({exc}); "
        "check the user (hostfile user=, ssh config User) and that your key "
        "is in the ssh-agent, a default key, or an IdentityFile (a certificate: "
        "CertificateFile, or KEY-cert.pub beside it)",
        exit_code=2,
    )


class _Transport(paramiko.Transport):
    """paramiko's transport offering the host key algorithms trust.py ordered, certificates
    included (paramiko parses them; trust.py checks them)."""

    host_key_algorithms: tuple[str, ...] = ()

    @property
    def preferred_keys(self) -> tuple[str, ...]:
        return tuple(a for a in self.host_key_algorithms if a in self._key_info)


def _transport(algorithms: tuple[str, ...], *args, **kwargs) -> paramiko.Transport:
    transport = _Transport(*args, **kwargs)
    transport.host_key_algorithms = algorithms
    options = transport.get_security_options()
    known = options.ciphers
    options.ciphers = tuple(c for c in AEAD_CIPHERS if c in known) + tuple(
        c for c in known if c not in AEAD_CIPHERS
    )
    return transport


def _tunnel(via: paramiko.SSHClient, target: Target, shown: str) -> paramiko.Channel:
    try:
        return via.get_transport().open_channel(
            "direct-tcpip",
            (target.hostname, target.port),
            ("127.0.0.1", 0),
            timeout=target.connect_timeout,
        )
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise NodeError(
            shown, f"jump host cannot reach {target.hostname}:{target.port}: {exc}"
        ) from None


def connect(host: Host, session: SshSession) -> SshConnection:
    """Connect to one host, through its jump hosts if any."""
    target = session.resolve(host)
    hops: list[paramiko.SSHClient] = []
    sock: object | None = None
    try:
        if target.proxy_jump:
            for jump in target.proxy_jump.split(","):
                user, _, rest = jump.rpartition("@")
                name, _, port = rest.partition(":")
                hop = session.resolve(
                    Host(name=name, user=user or None, port=int(port) if port else None)
                )
                if hops:
                    sock = _tunnel(hops[-1], hop, host.name)
                hops.append(_open_client(hop, session, sock, f"{host.name} (via jump host {jump})"))
            sock = _tunnel(hops[-1], target, host.name)
        elif target.proxy_command:
            sock = paramiko.ProxyCommand(target.proxy_command)
        client = _open_client(target, session, sock, host.name)
    except BaseException:
        for hop in hops:
            hop.close()
        raise
    return SshConnection(host.name, target, client, hops)
