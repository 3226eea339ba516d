"""known_hosts files as OpenSSH reads and writes them (sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT").

paramiko's HostKeys reads plain and hashed lines of one file, but skips `@cert-authority` and
`@revoked` lines, cannot tell which file and line a key came from, matches `[host]:port`
patterns with fnmatch (where `[` starts a character class) and writes only unhashed names.
This module covers those: every line of several files, markers, negated and wildcard
patterns, hashed names, and appending a line (hashed when HashKnownHosts is on).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from paramiko.message import Message

HASH_MAGIC = "|1|"
CERT_AUTHORITY = "@cert-authority"
REVOKED = "@revoked"


@dataclass(frozen=True)
class KnownKey:
    """One key line: `marker` is '', CERT_AUTHORITY or REVOKED; `blob` the public key."""

    marker: str
    patterns: str
    key_type: str
    blob: bytes
    where: str  # file:line, for messages

    def matches(self, name: str) -> bool:
        """Whether this line is about host `name` (`host` or `[host]:port`, lower case)."""
        if self.patterns.startswith(HASH_MAGIC):
            return _hashed_matches(self.patterns, name)
        return pattern_list_matches(self.patterns, name)


def host_port(host: str, port: int) -> str:
    """The name known_hosts uses for a host: `host`, or `[host]:port` off port 22."""
    return host.lower() if port == 22 else f"[{host.lower()}]:{port}"


def blob_type(blob: bytes) -> str:
    """The key type named inside a public key blob (e.g. 'ssh-ed25519')."""
    return Message(blob).get_text()


def pattern_list_matches(patterns: str, name: str) -> bool:
    """OpenSSH's match_hostname: a comma list of `*`/`?` patterns, `!` negates and wins."""
    matched = False
    for pattern in patterns.lower().split(","):
        negated = pattern.startswith("!")
        if _wildcard(pattern[1:] if negated else pattern).fullmatch(name):
            if negated:
                return False
            matched = True
    return matched


def _wildcard(pattern: str) -> re.Pattern[str]:
    # Only * and ? are special in ssh patterns; brackets are literal ([host]:port).
    return re.compile(
        "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    )


def _hashed_matches(field: str, name: str) -> bool:
    try:
        _, _, salt, digest = field.split("|", 3)
        want = base64.b64decode(digest)
        got = hmac.new(base64.b64decode(salt), name.encode(), hashlib.sha1).digest()
    except (ValueError, binascii.Error):
        return False
    return hmac.compare_digest(want, got)


def hashed_name(name: str, salt: bytes | None = None) -> str:
    """`|1|salt|hmac` as `ssh-keygen -H` and HashKnownHosts write it."""
    salt = salt if salt is not None else os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"{HASH_MAGIC}{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def parse(text: str, source: str) -> list[KnownKey]:
    """Every key line of one file; lines that are not keys are skipped, as ssh does."""
    keys = []
    for number, raw in enumerate(text.splitlines(), start=1):
        fields = raw.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = ""
        if fields[0].startswith("@"):
            marker, fields = fields[0].lower(), fields[1:]
            if marker not in (CERT_AUTHORITY, REVOKED):
                continue
        if len(fields) < 3:
            continue
        try:
            blob = base64.b64decode(fields[2], validate=True)
            if blob_type(blob) != fields[1]:
                continue
        except (binascii.Error, ValueError, UnicodeDecodeError):
            continue
        keys.append(KnownKey(marker, fields[0], fields[1], blob, f"{source}:{number}"))
    return keys


class KnownHostsFiles:
    """The known_hosts files of one command: read once each, appended to under a lock."""

    def __init__(self) -> None:
        self._cache: dict[str, list[KnownKey]] = {}
        self._lock = threading.Lock()

    def keys(self, paths: tuple[str, ...]) -> list[KnownKey]:
        """Every key line of `paths`, in order (a missing file has none, as for ssh)."""
        found: list[KnownKey] = []
        for path in paths:
            with self._lock:
                if path not in self._cache:
                    self._cache[path] = _read(path)
                found.extend(self._cache[path])
        return found

    def append(self, path: str, names: tuple[str, ...], blob: bytes, hashed: bool) -> None:
        """Record a key for `names` as ssh does: one line, or one hashed line per name."""
        key_type = blob_type(blob)
        encoded = base64.b64encode(blob).decode()
        fields = [hashed_name(n) for n in names] if hashed else [",".join(names)]
        lines = "".join(f"{field} {key_type} {encoded}\n" for field in fields)
        with self._lock:
            target = Path(path)
            if not target.exists():
                target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a", encoding="ascii") as handle:
                handle.write(lines)
            if path in self._cache:
                self._cache[path].extend(parse(lines, path))


def _read(path: str) -> list[KnownKey]:
    try:
        return parse(Path(path).read_text(encoding="utf-8", errors="replace"), path)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError):
        return []
