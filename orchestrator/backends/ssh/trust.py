"""Whether to trust the key a host presented: ssh's check_host_key(), step by step.

1. A key (or the CA of a certificate) listed `@revoked` for the host is refused.
2. A host certificate signed by a CA listed `@cert-authority` for the host, valid now and
   naming the host, is trusted. Any other certificate is judged as its plain key.
3. A plain key listed for the host (HostKeyAlias, or `host` / `[host]:port`) is trusted; a
   different key of the same type listed for it is a changed key; none is a new key.
4. StrictHostKeyChecking: `yes` (and `ask`) refuses new keys, `accept-new` records them in
   the first UserKnownHostsFile, `no` records them and goes on even past a changed or
   revoked key; such hosts are named in one warning per command.
5. CheckHostIP: the address must not be listed with another key; a new one is recorded.
"""

from __future__ import annotations

import ipaddress
import threading
from dataclasses import dataclass

import paramiko

from orchestrator.backends.ssh.certs import CERT_SUFFIX, Certificate, host_certificate
from orchestrator.backends.ssh.client_config import Target
from orchestrator.backends.ssh.known_hosts import (
    CERT_AUTHORITY,
    REVOKED,
    KnownHostsFiles,
    KnownKey,
    blob_type,
    host_port,
)
from orchestrator.backends.ssh.notices import warn_once

OK, NEW, CHANGED, REVOKED_STATUS = "ok", "new", "changed", "revoked"
# OpenSSH's default HostKeyAlgorithms, certificates first (those paramiko can verify).
PLAIN_ALGORITHMS = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "rsa-sha2-512",
    "rsa-sha2-256",
)
KEY_TYPE_OF = {"rsa-sha2-512": "ssh-rsa", "rsa-sha2-256": "ssh-rsa"}


class HostKeyRefused(paramiko.SSHException):
    """The host key failed the check; `reason` is 'unknown', 'changed' or 'revoked'."""

    def __init__(self, reason: str, name: str, key: paramiko.PKey, detail: str = "") -> None:
        super().__init__(f"{reason} host key for {name}")
        self.reason = reason
        self.name = name
        self.key = key
        self.detail = detail


@dataclass(frozen=True)
class Names:
    """The names a host's key is looked up under."""

    host: str  # HostKeyAlias, or host / [host]:port
    bare: str | None  # host without the port, also tried off port 22 (no HostKeyAlias)
    principal: str  # what a host certificate must name
    ip: str | None  # [address]:port form, when CheckHostIP applies


class Trust:
    """The trust decisions of one command: shared files, and hosts left unverified."""

    def __init__(self) -> None:
        self.files = KnownHostsFiles()
        self.unverified: list[str] = []
        self._lock = threading.Lock()

    def names(self, target: Target, address: str | None) -> Names:
        alias = target.trust.key_alias
        host = alias.lower() if alias else host_port(target.hostname, target.port)
        ip = None
        # ssh skips the address check through a proxy or when the name is an address.
        if target.trust.check_host_ip and address and not _is_address(target.hostname):
            ip = host_port(address, target.port)
        bare = target.hostname.lower() if not alias and target.port != 22 else None
        return Names(host, bare, (alias or target.hostname).lower(), ip)

    def algorithms(self, target: Target) -> tuple[str, ...]:
        """Host key algorithms to offer, ordered as ssh's order_hostkeyalgs() would."""
        default = tuple(a + CERT_SUFFIX for a in PLAIN_ALGORITHMS) + PLAIN_ALGORITHMS
        host = self.names(target, None).host
        known = [k for k in self._keys(target) if k.marker != REVOKED and k.matches(host)]
        if any(not k.marker and k.key_type == "ssh-ed25519" for k in known):
            return default
        first: list[str] = []
        for key in known:
            algorithms = [a for a in PLAIN_ALGORITHMS if KEY_TYPE_OF.get(a, a) == key.key_type]
            first += [a + CERT_SUFFIX for a in algorithms]
            if not key.marker:
                first += algorithms
        first = list(dict.fromkeys(first))
        return tuple(first) + tuple(a for a in default if a not in first)

    def check(self, target: Target, shown: str, key: paramiko.PKey, address: str | None) -> None:
        """Return when `key` may be used for `target`; raise HostKeyRefused when not."""
        names = self.names(target, address)
        settings = target.trust
        keys = self._keys(target)
        plain = key.asbytes()
        cert = host_certificate(key)
        status = _judge(keys, names.host, names.principal, plain, cert)
        if (
            status == NEW
            and names.bare
            and _judge(keys, names.bare, names.principal, plain, cert) == OK
        ):
            status = OK  # ssh also accepts the key listed under the name without the port
        if names.ip is None:
            ip_status = None
        elif cert is not None:
            ip_status = status  # ssh reads no address keys once shown a certificate
        else:
            ip_status = _status(keys, names.ip, plain)
        if status in (REVOKED_STATUS, CHANGED):
            if settings.strict != "no":
                reason = "revoked" if status == REVOKED_STATUS else "changed"
                raise HostKeyRefused(reason, names.host, key, _listed_at(keys, names.host, plain))
            return self._unverified(shown)
        if ip_status == CHANGED and names.ip:
            if settings.strict != "no":
                raise HostKeyRefused("changed", names.ip, key, _listed_at(keys, names.ip, plain))
            warn_once(
                f"the host key for {names.host} differs from the key for the IP address {names.ip}"
            )
        if status == NEW:
            if settings.strict == "yes":
                raise HostKeyRefused("unknown", names.host, key)
            recorded = (names.host, names.ip) if ip_status == NEW and names.ip else (names.host,)
            self._record(target, recorded, plain)
            if settings.strict == "no":
                self._unverified(shown)
        elif ip_status == NEW and names.ip and cert is None:
            self._record(target, (names.ip,), plain)

    def report(self) -> None:
        """One warning naming every host whose key was taken without verification."""
        with self._lock:
            hosts, self.unverified = sorted(set(self.unverified)), []
        if hosts:
            warn_once(f"host keys NOT verified (StrictHostKeyChecking no) for: {', '.join(hosts)}")

    def _keys(self, target: Target) -> list[KnownKey]:
        return self.files.keys(target.trust.user_files + target.trust.global_files)

    def _record(self, target: Target, names: tuple[str, ...], plain: bytes) -> None:
        if not target.trust.user_files:
            return
        path = target.trust.user_files[0]
        try:
            self.files.append(path, names, plain, target.trust.hash_known_hosts)
        except OSError as exc:  # ssh, too, goes on when it cannot record the key
            warn_once(f"could not record the host key of {names[0]} in {path}: {exc.strerror}")

    def _unverified(self, shown: str) -> None:
        with self._lock:
            self.unverified.append(shown)


def _judge(
    keys: list[KnownKey], name: str, principal: str, plain: bytes, cert: Certificate | None
) -> str:
    """The status of a key under one name: revoked, a valid certificate, else as plain."""
    revoked = {k.blob for k in keys if k.marker == REVOKED and k.matches(name)}
    if plain in revoked or (cert is not None and cert.ca_blob in revoked):
        return REVOKED_STATUS
    if (
        cert is not None
        and not cert.problem(principal)
        and any(
            k.marker == CERT_AUTHORITY and k.blob == cert.ca_blob and k.matches(name) for k in keys
        )
    ):
        return OK
    return _status(keys, name, plain)


def _status(keys: list[KnownKey], name: str, plain: bytes) -> str:
    wanted = blob_type(plain)
    same_type = [k for k in keys if not k.marker and k.key_type == wanted and k.matches(name)]
    if any(k.blob == plain for k in same_type):
        return OK
    return CHANGED if same_type else NEW


def _listed_at(keys: list[KnownKey], name: str, plain: bytes) -> str:
    wanted = blob_type(plain)
    return next(
        (k.where for k in keys if not k.marker and k.key_type == wanted and k.matches(name)), ""
    )


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
