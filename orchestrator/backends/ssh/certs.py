"""OpenSSH certificates (PROTOCOL.certkeys): parse one, and check a host's as ssh does.

A user certificate (CertificateFile) is only parsed here, for the key it certifies: the
server judges it. A host certificate: paramiko accepts a `*-cert-v01@openssh.com` host key
during key exchange (it verifies the exchange signature with the certified key and keeps
the certificate as `public_blob`) but never looks inside. ssh's check_host_cert() is
reproduced here: a host certificate, signed by the CA's key, currently valid, naming the
host among its principals (no principals means any host), and carrying no critical options."""

from __future__ import annotations

import time
from dataclasses import dataclass

import paramiko
from paramiko.message import Message

from orchestrator.backends.ssh.known_hosts import pattern_list_matches

CERT_SUFFIX = "-cert-v01@openssh.com"
USER_CERT, HOST_CERT = 1, 2


@dataclass(frozen=True)
class Certificate:
    key_type: str  # e.g. ssh-ed25519-cert-v01@openssh.com
    key_blob: bytes  # the certified key, as a plain public key blob
    cert_type: int
    key_id: str
    principals: tuple[str, ...]
    valid_after: int
    valid_before: int
    critical_options: bytes
    ca_blob: bytes
    signed: bytes  # the bytes the CA signed
    signature: bytes

    def problem(self, name: str, now: float | None = None) -> str | None:
        """Why this certificate does not vouch for host `name` (None: it does)."""
        now = time.time() if now is None else now
        if self.cert_type != HOST_CERT:
            return "it is not a host certificate"
        if not self.valid_after <= now < self.valid_before:
            return "it is outside its validity period"
        # ssh accepts wildcard principals in host certificates.
        if self.principals and not any(
            pattern_list_matches(p, name.lower()) for p in self.principals
        ):
            return f"{name} is not among its principals ({', '.join(self.principals)})"
        if self.critical_options:
            return "it carries critical options"
        try:
            ca = paramiko.PKey.from_type_string(Message(self.ca_blob).get_text(), self.ca_blob)
            if not ca.verify_ssh_sig(self.signed, Message(self.signature)):
                return "its signature does not verify"
        except Exception as exc:  # an unknown CA key type or a malformed signature
            return f"its signature cannot be checked ({exc})"
        return None


def host_certificate(key: paramiko.PKey) -> Certificate | None:
    """The certificate a server presented as its host key, or None for a plain key."""
    blob = getattr(key, "public_blob", None)
    if blob is None or not blob.key_type.endswith(CERT_SUFFIX):
        return None
    try:
        return parse(blob.key_blob)
    except Exception:  # a malformed certificate is one that vouches for nothing
        return None


def parse(blob: bytes) -> Certificate:
    message = Message(blob)
    key_type = message.get_text()
    message.get_string()  # nonce
    start = message.packet.tell()
    if key_type.startswith("ssh-ed25519"):
        message.get_string()
    elif key_type.startswith("ecdsa-"):
        message.get_string()
        message.get_string()
    elif key_type.startswith(("ssh-rsa", "rsa-sha2")):
        message.get_mpint()
        message.get_mpint()
    else:
        raise ValueError(f"unsupported certificate type {key_type}")
    # The key's fields follow the nonce in the order of the plain key's own blob.
    plain = Message()
    plain.add_string(key_type.removesuffix(CERT_SUFFIX))
    key_blob = plain.asbytes() + blob[start : message.packet.tell()]
    message.get_int64()  # serial
    kind = message.get_int()
    key_id = message.get_text()
    principals_data = Message(message.get_string())
    valid_after = message.get_int64()
    valid_before = message.get_int64()
    critical = message.get_string()
    message.get_string()  # extensions: none matter for a host certificate
    message.get_string()  # reserved
    ca_blob = message.get_string()
    signed = blob[: message.packet.tell()]
    signature = message.get_string()
    principals = []
    while principals_data.get_remainder():
        principals.append(principals_data.get_text())
    return Certificate(
        key_type,
        key_blob,
        kind,
        key_id,
        tuple(principals),
        valid_after,
        valid_before,
        critical,
        ca_blob,
        signed,
        signature,
    )
