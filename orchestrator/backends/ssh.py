"""The SSH backend: paramiko connections that behave as users expect from `ssh`.

- ~/.ssh/config is honoured: Host aliases, HostName, User, Port, IdentityFile, ProxyJump
  and ProxyCommand; a user or port in the hostfile wins over it.
- The ssh-agent and the default keys (~/.ssh/id_*) are tried, as ssh does.
- Host keys are checked against ~/.ssh/known_hosts (and /etc/ssh/ssh_known_hosts). An
  unknown key is refused unless `accept_new_host_keys`, which records it (like ssh's
  StrictHostKeyChecking=accept-new); a changed key is always refused.
- Every node is connected in parallel, with a connect timeout and keepalives; one node
  that cannot be reached fails the whole step, by name, before anything starts.
"""

from __future__ import annotations

import errno
import getpass
import os
import shlex
import socket
import stat
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import paramiko

from orchestrator.agent import agent_argv
from orchestrator.backends.base import (
    DEFAULT_CONNECT_TIMEOUT_S,
    MISSING_PYTHON_WORDS,
    IdleAgent,
    SshOptions,
)
from orchestrator.errors import NodeError, NodeErrors
from orchestrator.hostfile import Host

KEEPALIVE_S = 5
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
# Tried first when the server offers them: paramiko decrypts AES-GCM at about three times
# the speed of its default AES-CTR + HMAC-SHA2 (the controller reads every rank's output).
AEAD_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


class UnknownHostKey(paramiko.SSHException):
    def __init__(self, name: str, key: paramiko.PKey) -> None:
        super().__init__(name)
        self.name = name
        self.key = key


class KnownHosts:
    """The known_hosts policy shared by all connections of one command."""

    def __init__(self, options: SshOptions) -> None:
        self.path = Path(os.path.expanduser(options.known_hosts))
        self.accept_new = options.accept_new_host_keys
        self.lock = threading.Lock()

    def load_into(self, client: paramiko.SSHClient) -> None:
        if os.path.isfile(SYSTEM_KNOWN_HOSTS):
            client.load_system_host_keys(SYSTEM_KNOWN_HOSTS)
        if self.path.is_file():
            client.get_host_keys().load(str(self.path))
        client.set_missing_host_key_policy(self.Policy(self))

    class Policy(paramiko.MissingHostKeyPolicy):
        def __init__(self, known: KnownHosts) -> None:
            self.known = known

        def missing_host_key(self, client, hostname, key) -> None:
            if not self.known.accept_new:
                raise UnknownHostKey(hostname, key)
            self.known.record(hostname, key)
            client.get_host_keys().add(hostname, key.get_name(), key)

    def record(self, name: str, key: paramiko.PKey) -> None:
        """Append one line, as ssh does (the rest of the file is left exactly as it is)."""
        with self.lock:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a", encoding="ascii") as handle:
                handle.write(f"{name} {key.get_name()} {key.get_base64()}\n")


@dataclass(frozen=True)
class Target:
    """Where and how to reach one host, after ~/.ssh/config and the hostfile."""

    alias: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    proxy_jump: str | None
    proxy_command: str | None


def resolve(alias: str, config: paramiko.SSHConfig, options: SshOptions,
            user: str | None = None, port: int | None = None) -> Target:
    found = config.lookup(alias)
    jump = found.get("proxyjump")
    return Target(
        alias=alias,
        hostname=found.get("hostname", alias),
        port=port or int(found.get("port", 22)),
        user=user or found.get("user") or getpass.getuser(),
        identity_files=tuple(options.identity_files) + tuple(found.get("identityfile", [])),
        proxy_jump=None if not jump or jump.lower() == "none" else jump,
        proxy_command=found.get("proxycommand") if found.get("proxycommand", "").lower()
        != "none" else None,
    )


def load_config(options: SshOptions) -> paramiko.SSHConfig:
    path = os.path.expanduser(options.config_path)
    if not os.path.isfile(path):
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(path)
    except (OSError, paramiko.SSHException) as exc:
        raise NodeError("ssh config", f"cannot read {path}: {exc}", exit_code=2) from None


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

    def __init__(self, host: str, target: Target, client: paramiko.SSHClient,
                 hops: list[paramiko.SSHClient]) -> None:
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
            f"{{ echo \"python {shlex.quote(python)} {MISSING_PYTHON_WORDS}\" >&2; "
            "exit 127; }; "
            f"ORCHESTRATOR_RUN_ID={shlex.quote(tag)} exec {shlex.join(agent_argv(python, tag))}"
        )
        try:
            channel = self.client.get_transport().open_session(timeout=DEFAULT_CONNECT_TIMEOUT_S)
            channel.exec_command(command)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise NodeError(self.host, f"cannot start the node agent: {exc}") from None
        return SshChannel(channel)

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


def _open_client(target: Target, known: KnownHosts, options: SshOptions,
                 sock: object | None, shown: str) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    known.load_into(client)
    where = f"{target.hostname}:{target.port}"
    timeout = options.connect_timeout
    try:
        client.connect(
            target.hostname, port=target.port, username=target.user,
            key_filename=list(target.identity_files) or None, allow_agent=True,
            look_for_keys=True, timeout=timeout, banner_timeout=timeout,
            auth_timeout=timeout, sock=sock, transport_factory=_transport,
        )
    except UnknownHostKey as exc:
        client.close()
        raise NodeError(shown, f"host key of {exc.name} is not in {known.path} "
                        f"({exc.key.get_name()} {exc.key.fingerprint}); check it and add it "
                        "(e.g. ssh once, or ssh-keyscan), or rerun with --accept-new-host-keys "
                        "to accept and record unknown keys", exit_code=2) from None
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise NodeError(shown, f"host key of {exc.hostname} has CHANGED (now "
                        f"{exc.key.get_name()} {exc.key.fingerprint}): the node was reinstalled, "
                        "or someone is in between. If you trust the change, remove the old key "
                        f"(ssh-keygen -R {exc.hostname} -f {known.path}) and connect again",
                        exit_code=2) from None
    except paramiko.AuthenticationException as exc:
        client.close()
        raise _authentication_failed(shown, target, where, exc) from None
    except socket.gaierror:
        client.close()
        raise NodeError(shown, f"cannot resolve host name {target.hostname!r}; check the "
                        "hostfile and ~/.ssh/config", exit_code=2) from None
    except TimeoutError:
        client.close()
        raise NodeError(shown, f"no answer from {where} within {timeout:g} s "
                        "(node down, or unreachable from here?)") from None
    except paramiko.ssh_exception.NoValidConnectionsError as exc:
        client.close()
        codes = {getattr(e, "errno", None) for e in exc.errors.values()}
        if codes == {errno.ECONNREFUSED}:
            raise NodeError(shown, f"connection refused at {where} (is sshd running there, "
                            "and is the port right?)") from None
        reasons = "; ".join(sorted({os.strerror(e.errno) if getattr(e, "errno", None)
                                    else str(e) for e in exc.errors.values()}))
        raise NodeError(shown, f"cannot connect to {where}: {reasons} (node down, or "
                        "unreachable from here?)") from None
    except (OSError, EOFError, paramiko.SSHException) as exc:
        client.close()
        if str(exc) == NO_KEY_TO_OFFER:
            raise _authentication_failed(shown, target, where, exc) from None
        raise NodeError(shown, f"cannot connect to {where}: {exc}") from None
    client.get_transport().set_keepalive(KEEPALIVE_S)
    return client


# paramiko's words when it found no key to try at all: no agent, no default key, no
# IdentityFile. It raises a plain SSHException for it, not an AuthenticationException.
NO_KEY_TO_OFFER = "No authentication methods available"


def _authentication_failed(shown: str, target: Target, where: str,
                           exc: Exception) -> NodeError:
    return NodeError(shown, f"authentication failed as {target.user}@{where} ({exc}); "
                     "check the user (hostfile user=, ~/.ssh/config User) and that your key "
                     "is in the ssh-agent, a default key, or an IdentityFile", exit_code=2)


def _transport(*args, **kwargs) -> paramiko.Transport:
    transport = paramiko.Transport(*args, **kwargs)
    options = transport.get_security_options()
    known = options.ciphers
    options.ciphers = tuple(c for c in AEAD_CIPHERS if c in known) + \
        tuple(c for c in known if c not in AEAD_CIPHERS)
    return transport


def _tunnel(via: paramiko.SSHClient, target: Target, options: SshOptions,
            shown: str) -> paramiko.Channel:
    try:
        return via.get_transport().open_channel(
            "direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0),
            timeout=options.connect_timeout)
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise NodeError(shown, f"jump host cannot reach {target.hostname}:{target.port}: "
                        f"{exc}") from None


def connect(host: Host, options: SshOptions, config: paramiko.SSHConfig,
            known: KnownHosts) -> SshConnection:
    """Connect to one host, through its jump hosts if any."""
    target = resolve(host.name, config, options, user=host.user, port=host.port)
    hops: list[paramiko.SSHClient] = []
    sock: object | None = None
    try:
        if target.proxy_jump:
            for jump in target.proxy_jump.split(","):
                user, _, rest = jump.rpartition("@")
                name, _, port = rest.partition(":")
                hop = resolve(name, config, options, user=user or None,
                              port=int(port) if port else None)
                if hops:
                    sock = _tunnel(hops[-1], hop, options, host.name)
                hops.append(_open_client(hop, known, options, sock,
                                         f"{host.name} (via jump host {jump})"))
            sock = _tunnel(hops[-1], target, options, host.name)
        elif target.proxy_command:
            sock = paramiko.ProxyCommand(target.proxy_command)
        client = _open_client(target, known, options, sock, host.name)
    except BaseException:
        for hop in hops:
            hop.close()
        raise
    return SshConnection(host.name, target, client, hops)


def connect_all(hosts: Sequence[Host], options: SshOptions | None) -> list:
    """Connect to every host in parallel; local hosts get a local connection.

    Raises `NodeErrors` naming every host that failed (after closing the others).
    """
    from orchestrator.backends.local import LocalConnection

    options = options or SshOptions()
    config = load_config(options)
    known = KnownHosts(options)

    def one(host: Host):
        return LocalConnection(host.name) if host.is_local else \
            connect(host, options, config, known)

    with ThreadPoolExecutor(max_workers=min(64, max(1, len(hosts)))) as pool:
        futures = [pool.submit(one, host) for host in hosts]
    connections, errors = [], []
    for host, future in zip(hosts, futures, strict=True):
        try:
            connections.append(future.result())
        except NodeError as exc:
            errors.append(exc)
        except Exception as exc:  # a bug or an unforeseen paramiko error: still name the host
            errors.append(NodeError(host.name, f"cannot connect: {exc!r}"))
    if errors:
        for connection in connections:
            connection.close()
        raise NodeErrors(errors, "connecting")
    return connections
