"""The keys `ssh HOST` offers for publickey login, in its order, user certificates included.

paramiko's SSHClient tries key files before the agent, offers a file's `-cert.pub` instead
of the key itself, and knows no CertificateFile. ssh (pubkey_prepare() in sshconnect2.c)
offers, in this order:

1. each CertificateFile holding a user certificate, signed by the private key it
   certifies (an identity file's or an agent key); without that key it cannot be used;
2. the agent's keys that are also identity files, in the agent's order;
3. the agent's other keys, unless IdentitiesOnly;
4. the identity files not offered yet (IdentityFile, else the default ~/.ssh/id_*), each
   followed by its `<file>-cert.pub`, which ssh reads only when no CertificateFile is named.

The client does not judge its own certificates: the server checks CA, principals, validity.
"""

from __future__ import annotations

import base64
import copy
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import paramiko
from paramiko.auth_strategy import AuthStrategy, InMemoryPrivateKey
from paramiko.message import Message
from paramiko.pkey import PublicBlob

from orchestrator.backends.ssh.certs import CERT_SUFFIX, USER_CERT, parse
from orchestrator.backends.ssh.client_config import Target
from orchestrator.backends.ssh.notices import warn_once

# ssh's default identities (readconf.c), when no IdentityFile is named; of these, paramiko
# reads the rsa, ecdsa and ed25519 keys.
DEFAULT_IDENTITIES = (
    "~/.ssh/id_rsa",
    "~/.ssh/id_ecdsa",
    "~/.ssh/id_ecdsa_sk",
    "~/.ssh/id_ed25519",
    "~/.ssh/id_ed25519_sk",
    "~/.ssh/id_xmss",
    "~/.ssh/id_dsa",
)
KEY_CLASSES = (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey)
IMPLICIT_CERT = "-cert.pub"
OPENSSH_KEY_MAGIC = b"openssh-key-v1\x00"


@dataclass(frozen=True)
class _Identity:
    path: str
    public: bytes | None  # the plain public key blob, when readable
    private: paramiko.PKey | None  # None when unreadable without a passphrase


def offers(target: Target, agent_keys: Sequence[paramiko.PKey]) -> list[paramiko.PKey]:
    """The keys to try, in ssh's order, for `target` with these agent keys; a key with a
    certificate (`public_blob`) presents the certificate."""
    names = target.identity_files or tuple(os.path.expanduser(p) for p in DEFAULT_IDENTITIES)
    identities = [found for found in map(_identity, names) if found is not None]
    listed = {identity.public for identity in identities}
    from_agent = [key for key in agent_keys if key.asbytes() in listed]
    if not target.identities_only:
        from_agent += [key for key in agent_keys if key.asbytes() not in listed]
    signers = from_agent + [i.private for i in identities if i.private is not None]

    found: list[paramiko.PKey] = []
    for path in target.certificate_files:
        offer = _certified(path, signers, explicit=True)
        if offer is not None:
            found.append(offer)
    found += from_agent
    by_agent = {key.asbytes() for key in from_agent}
    for identity in identities:
        if identity.private is not None and identity.public not in by_agent:
            found.append(identity.private)
        beside = identity.path + IMPLICIT_CERT
        if not target.certificate_files and os.path.isfile(beside):
            offer = _certified(beside, signers, explicit=False)
            if offer is not None:
                found.append(offer)
    return found


def _identity(path: str) -> _Identity | None:
    if not os.path.isfile(path):
        return None  # ssh, too, goes on without a missing identity file
    for kind in KEY_CLASSES:
        try:
            key = kind.from_private_key_file(path)
        except paramiko.PasswordRequiredException:
            break  # BatchMode: nobody types the passphrase; the agent may hold the key
        except (paramiko.SSHException, ValueError, OSError):
            continue
        return _Identity(path, key.asbytes(), key)
    public = _public_half(path)
    return _Identity(path, public, None) if public else None


def _public_half(path: str) -> bytes | None:
    """A locked key's public half, found as ssh finds it: in `path`.pub, else in the clear
    part of an OpenSSH-format private key file (for the agent to match it)."""
    try:
        return PublicBlob.from_file(path + ".pub").key_blob
    except (OSError, ValueError):
        pass
    try:
        with open(path, encoding="ascii") as handle:
            lines = handle.read().splitlines()
        data = base64.b64decode("".join(line for line in lines if not line.startswith("-")))
    except (OSError, ValueError):
        return None
    if not data.startswith(OPENSSH_KEY_MAGIC):
        return None
    header = Message(data[len(OPENSSH_KEY_MAGIC) :])
    for _ in range(3):  # cipher name, KDF name, KDF options
        header.get_string()
    return header.get_string() if header.get_int() >= 1 else None


def _certified(path: str, signers: Sequence[paramiko.PKey], explicit: bool) -> paramiko.PKey | None:
    """The certificate in `path` with the private key it certifies, if one is at hand."""
    try:
        blob = PublicBlob.from_file(path)
        cert = parse(blob.key_blob) if blob.key_type.endswith(CERT_SUFFIX) else None
    except FileNotFoundError:
        return None  # as ssh: a CertificateFile that does not exist is skipped
    except (OSError, ValueError, paramiko.SSHException) as exc:
        if explicit:
            warn_once(f"CertificateFile {path} cannot be read ({exc}); going on without it")
        return None
    if cert is None or cert.cert_type != USER_CERT:
        if explicit:
            warn_once(f"CertificateFile {path} holds no user certificate; going on without it")
        return None
    signer = next((key for key in signers if key.asbytes() == cert.key_blob), None)
    if signer is None:
        if explicit:
            warn_once(
                f"CertificateFile {path} certifies a key that is neither an identity "
                "file nor in the ssh-agent; going on without it"
            )
        return None
    certified = copy.copy(signer)  # the signer may be offered plain, too
    certified.public_blob = blob
    return certified


class OfferedKeys(AuthStrategy):
    """paramiko's login step (`SSHClient.connect(auth_strategy=...)`) done as ssh does it."""

    def __init__(self, target: Target) -> None:
        super().__init__(ssh_config=None)
        self.target = target

    def get_sources(self) -> Iterator[InMemoryPrivateKey]:
        agent = _agent()
        try:
            for key in offers(self.target, agent.get_keys() if agent else ()):
                yield InMemoryPrivateKey(self.target.user, key)
        finally:
            if agent is not None:
                agent.close()

    def authenticate(self, transport: paramiko.Transport) -> list[str]:
        """Try each key in turn; raise AuthenticationException, in one line, if none does."""
        tried = []
        for source in self.get_sources():
            tried.append(source.pkey)
            try:
                further = source.authenticate(transport)
            except paramiko.BadAuthenticationType:
                raise  # the server takes no key at all for this user
            except paramiko.AuthenticationException:
                continue  # refused: ssh tries the next
            except paramiko.SSHException:
                if not transport.is_active():
                    raise
                continue  # its signature could not be made: ssh, too, goes on
            if further:  # a second factor is asked for: in BatchMode nobody can answer
                raise paramiko.AuthenticationException(
                    f"the server asks for more than a key ({', '.join(further)})"
                )
            return further
        if not tried:
            raise paramiko.AuthenticationException(
                "no key to offer: no agent key, default key or IdentityFile"
            )
        raise paramiko.AuthenticationException(
            f"no key was accepted; offered {', '.join(map(_described, tried))}"
        )


def _agent() -> paramiko.Agent | None:
    try:
        return paramiko.Agent()  # none without SSH_AUTH_SOCK
    except paramiko.SSHException:
        return None  # as ssh: an agent that does not answer offers nothing


def _described(key: paramiko.PKey) -> str:
    kind = key.public_blob.key_type if key.public_blob else key.get_name()
    return f"{kind} {key.fingerprint}"
