"""SSH material of the lab: ed25519 keys, sshd configs, the controller's ~/.ssh, known_hosts.

The controller side is a temporary HOME whose `.ssh` holds the client key, a config and a
known_hosts file. paramiko expands `~` with $HOME, so running the CLI with HOME=<that dir>
makes it use them. OpenSSH's `ssh` takes `~` from the password database instead of $HOME,
so the config written here names the identity and known_hosts files by absolute path and
`ssh -F <config>` works from any environment.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

if TYPE_CHECKING:
    from tests.lab.netns import Node


@dataclass(frozen=True)
class KeyPair:
    """An ed25519 key in OpenSSH formats; `public` is 'ssh-ed25519 AAAA...' without comment."""

    private: str
    public: str

    def write(self, path: Path, comment: str = "") -> None:
        """Write `path` (mode 0600) and `path.pub`."""
        path.write_text(self.private)
        path.chmod(0o600)
        path.with_name(path.name + ".pub").write_text(f"{self.public} {comment}".rstrip() + "\n")


def new_key() -> KeyPair:
    """A fresh ed25519 key pair (in-process; ssh-keygen would cost a process per key)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    return KeyPair(private, public)


def sshd_config(
    *,
    address: str,
    host_key: Path,
    pid_file: Path,
    authorized_keys: Path,
    extra: str = "",
    stock_limits: bool = False,
) -> str:
    """The sshd_config of one node: its own address, host key and pid file; key login only.
    `stock_limits`: no MaxStartups / MaxSessions lines, so OpenSSH's defaults apply (10:30:100
    and 10), as on a login node nobody tuned."""
    lines = [
        f"ListenAddress {address}",
        "Port 22",
        f"HostKey {host_key}",
        f"PidFile {pid_file}",
        f"AuthorizedKeysFile {authorized_keys}",
        "UsePAM no",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        # The lab's files live under /tmp, which StrictModes would reject.
        "StrictModes no",
        # Fan-out: many concurrent unauthenticated connections and sessions per connection.
        *([] if stock_limits else ["MaxStartups 1024", "MaxSessions 256"]),
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "AcceptEnv LANG LC_*",
        "Subsystem sftp /usr/lib/openssh/sftp-server",
    ]
    return "\n".join(lines) + "\n" + (extra.rstrip() + "\n" if extra else "")


def sign_host_key(
    ca_key: Path,
    public_key: Path,
    principals: Sequence[str],
    *,
    validity: str = "always:forever",
    identity: str = "orchestrator-lab",
) -> Path:
    """Sign a host's public key with OpenSSH's ssh-keygen; returns the `-cert.pub` path.

    No `principals` makes a certificate valid for any host name, as ssh-keygen does.
    """
    return _sign(ca_key, public_key, principals, ["-h"], validity, identity)


def sign_user_key(
    ca_key: Path,
    public_key: Path,
    principals: Sequence[str],
    *,
    validity: str = "always:forever",
    identity: str = "orchestrator-lab-user",
) -> str:
    """A user certificate for `public_key` (ssh-keygen -s), as the text of a `-cert.pub`
    file; sshd with `TrustedUserCAKeys` takes it for a user among `principals`."""
    path = _sign(ca_key, public_key, principals, [], validity, identity)
    text = path.read_text()
    path.unlink()  # the next certificate of the same key goes to the same name
    return text


def _sign(
    ca_key: Path,
    public_key: Path,
    principals: Sequence[str],
    kind: list[str],
    validity: str,
    identity: str,
) -> Path:
    argv = ["ssh-keygen", "-q", "-s", str(ca_key), "-I", identity, *kind, "-V", validity]
    if principals:
        argv += ["-n", ",".join(principals)]
    subprocess.run([*argv, str(public_key)], check=True, capture_output=True)
    return public_key.with_name(public_key.name.removesuffix(".pub") + "-cert.pub")


def known_hosts_line(node: Node, key: str | None = None) -> str:
    """A known_hosts line for `node` under its name and address (`key` defaults to the real one)."""
    return f"{node.name},{node.address} {key or node.host_public_key}\n"


def wrong_host_key() -> str:
    """A valid ed25519 public key that belongs to no node: a 'changed host key' for tests."""
    return new_key().public


@dataclass(frozen=True)
class SshHome:
    """The controller's temporary HOME with `.ssh/` for one cluster."""

    home: Path
    identity: KeyPair

    @property
    def ssh_dir(self) -> Path:
        return self.home / ".ssh"

    @property
    def key_path(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def config_path(self) -> Path:
        return self.ssh_dir / "config"

    @property
    def known_hosts_path(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @classmethod
    def create(cls, home: Path) -> SshHome:
        ssh_home = cls(home, new_key())
        ssh_home.ssh_dir.mkdir(parents=True, mode=0o700)
        ssh_home.identity.write(ssh_home.key_path, comment="orchestrator-lab")
        return ssh_home

    def default_config(self, nodes: Iterable[Node], subnet_glob: str) -> str:
        """Client config for OpenSSH: root, this key and known_hosts, strict host-key checks."""
        hosts = " ".join([*(n.name for n in nodes), subnet_glob])
        return (
            f"Host {hosts}\n"
            "    User root\n"
            f"    IdentityFile {self.key_path}\n"
            "    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {self.known_hosts_path}\n"
            "    StrictHostKeyChecking yes\n"
            "    BatchMode yes\n"
            "    ConnectTimeout 5\n"
            "    LogLevel ERROR\n"
        )

    def write_config(self, text: str) -> Path:
        self.config_path.write_text(text)
        self.config_path.chmod(0o600)
        return self.config_path

    def write_known_hosts(
        self,
        nodes: Iterable[Node],
        *,
        changed: Mapping[str, str] | None = None,
        path: Path | None = None,
    ) -> Path:
        """Write known_hosts listing `nodes` (others are unknown); `changed` maps name -> key."""
        changed = changed or {}
        target = path or self.known_hosts_path
        target.write_text("".join(known_hosts_line(n, changed.get(n.name)) for n in nodes))
        return target


def connect(
    node: Node,
    key_path: Path,
    known_hosts: Path,
    *,
    timeout: float = 5.0,
) -> paramiko.SSHClient:
    """A paramiko client logged into `node` as root, rejecting any host key not in known_hosts."""
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(
            node.name,
            username="root",
            key_filename=str(key_path),
            look_for_keys=False,
            allow_agent=False,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
        )
    except BaseException:
        # A failed connect (e.g. a rejected host key) leaves the transport thread and its
        # socket open, and sshd keeps a pre-auth process per connection, until closed.
        client.close()
        raise
    return client


def run_over_ssh(
    node: Node, command: str, key_path: Path, known_hosts: Path, timeout: float = 60.0
) -> tuple[int, str, str]:
    """Run `command` on `node` via paramiko; returns (exit status, stdout, stderr)."""
    client = connect(node, key_path, known_hosts)
    try:
        _stdin, stdout, stderr = client.exec_command(command, timeout=timeout)
        out = stdout.read().decode(errors="replace")
        err = stderr.read().decode(errors="replace")
        return stdout.channel.recv_exit_status(), out, err
    finally:
        client.close()
