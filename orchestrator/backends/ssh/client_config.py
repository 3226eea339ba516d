"""Which user, port, address, keys and trust settings `ssh HOST` would use (`ssh -G HOST`).

paramiko's SSHConfig evaluates `Host` and `Match` blocks (first value wins) and expands
tokens in HostName, IdentityFile, ProxyCommand and ProxyJump. What it lacks is added here:
`Include` (globs, paths relative to ~/.ssh or /etc/ssh, conditional inside a block), the
system config after the user's (as ssh reads both unless given -F), tokens in the
known_hosts keywords, every `CertificateFile` line (paramiko keeps only the first), and a
warning naming file:line for a keyword we do not honour.
"""

from __future__ import annotations

import getpass
import glob
import hashlib
import os
import re
import shlex
import socket
from dataclasses import dataclass

import paramiko

from orchestrator.backends.base import DEFAULT_CONNECT_TIMEOUT_S
from orchestrator.backends.ssh.notices import warn_once
from orchestrator.errors import ConfigError, SourceError
from orchestrator.numerals import PORT, NumberError, shown, whole_number
from orchestrator.options.reaching import SshOptions

USER_CONFIG = "~/.ssh/config"
DEFAULT_PORT = 22
MAX_SECONDS = 86400 * 365  # ConnectTimeout, ServerAliveInterval: a year is more than any
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
MAX_INCLUDE_DEPTH = 16
LINE = re.compile(r"(\w+)(?:\s*=\s*|\s+)(.+)")
# paramiko keeps the first value of a keyword (IdentityFile aside), but ssh adds up
# CertificateFile lines: each is handed to paramiko under a keyword of its own, `certfileN`.
CERT_FILE_KEY = "certfile"

# What we act on (BatchMode: we never prompt, so it is always on).
_HONOURED = """
    host match include hostname user port identityfile identitiesonly proxyjump proxycommand
    userknownhostsfile globalknownhostsfile stricthostkeychecking hostkeyalias checkhostip
    hashknownhosts connecttimeout serveraliveinterval batchmode canonicalizehostname
    certificatefile
    canonicaldomains canonicalizemaxdots canonicalizefallbacklocal
"""
HONOURED = frozenset(_HONOURED.split())
# What cannot change whether or how a batch command without forwarding connects.
_NO_EFFECT = """
    loglevel logverbose syslogfacility forwardagent forwardx11 forwardx11trusted
    forwardx11timeout compression controlmaster controlpath controlpersist serveralivecountmax
    tcpkeepalive sendenv requesttty escapechar visualhostkey passwordauthentication
    kbdinteractiveauthentication kbdinteractivedevices challengeresponseauthentication
    numberofpasswordprompts addkeystoagent usekeychain ipqos localforward remoteforward
    dynamicforward exitonforwardfailure clearallforwardings gatewayports permitlocalcommand
    localcommand gssapiauthentication gssapidelegatecredentials
    streamlocalbindmask streamlocalbindunlink forkafterauthentication sessiontype stdinnull
    ignoreunknown permitremoteopen xauthlocation enableescapecommandline obscurekeystroketiming
"""
NO_EFFECT = frozenset(_NO_EFFECT.split())


@dataclass(frozen=True)
class HostTrust:
    """How a host's key is judged: ssh's known_hosts settings for it."""

    user_files: tuple[str, ...]
    global_files: tuple[str, ...]
    strict: str  # "yes" (also for ask: nobody is there to answer), "accept-new" or "no"
    key_alias: str | None  # HostKeyAlias
    check_host_ip: bool
    hash_known_hosts: bool


@dataclass(frozen=True)
class Target:
    """Where and how to reach one host, after the ssh config and the hostfile."""

    alias: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    identities_only: bool
    proxy_jump: str | None
    proxy_command: str | None
    connect_timeout: float
    keepalive_s: float | None  # ServerAliveInterval when set
    trust: HostTrust
    certificate_files: tuple[str, ...] = ()  # CertificateFile, `~` and tokens expanded


class SshConfig:
    """The user's config (then the system's, unless a file was named) for every host."""

    def __init__(self, path: str | None = None) -> None:
        files = [(path, True)] if path else [(USER_CONFIG, True), (SYSTEM_CONFIG, False)]
        self.lines: list[tuple[str, str, str]] = []  # (file:line, keyword, value)
        for name, is_user in files:
            full = os.path.expanduser(name)
            if os.path.isfile(full):
                self._read(full, is_user, "", 0)
        text = "\n".join(
            f"{_paramiko_keyword(keyword, n)} {value}"
            for n, (_, keyword, value) in enumerate(self.lines)
        )
        self._config = paramiko.SSHConfig.from_text(text)

    def lookup(self, alias: str) -> paramiko.SSHConfigDict:
        found = self._config.lookup(alias)
        for keyword, value in found.items():
            if keyword.startswith(CERT_FILE_KEY):
                continue
            switched_off = isinstance(value, str) and value.lower() in ("no", "none")
            if keyword not in HONOURED and keyword not in NO_EFFECT and not switched_off:
                where = self._origin(keyword, value)
                warn_once(
                    f"{where}: ssh option {keyword!r} is not supported here; going on "
                    "as ssh would without it"
                )
        return found

    def port(self, found: paramiko.SSHConfigDict) -> int:
        """Port (22 when not set); one out of range is an error naming its line."""
        value = found.get("port")
        if value is None:
            return DEFAULT_PORT
        try:
            return whole_number(value, "Port", *PORT)
        except NumberError as exc:
            raise ConfigError(f"{self._origin('port', value)}: {exc}") from None

    def seconds(self, found: paramiko.SSHConfigDict, keyword: str) -> float | None:
        """A time in seconds (ConnectTimeout, ServerAliveInterval); None when not set or
        not a number (ssh's 1m30s forms), an error naming its line past MAX_SECONDS."""
        value = found.get(keyword.lower())
        try:
            number = float(value) if value else None
        except ValueError:
            return None
        if number is not None and not 0 <= number <= MAX_SECONDS:  # inf and nan too
            where = self._origin(keyword.lower(), value)
            raise ConfigError(
                f"{where}: {keyword} must be from 0 to {MAX_SECONDS} seconds, got {shown(value)}"
            )
        return number

    def _origin(self, keyword: str, value: object) -> str:
        first = None
        for where, word, text in self.lines:
            if word.lower() == keyword:
                first = first or where
                if text.strip('"') == value:
                    return where
        return first or "ssh config"

    def _read(self, path: str, is_user: bool, condition: str, depth: int) -> None:
        """Append `path`'s lines; inside a block (`condition`), its blocks are narrowed."""
        if depth > MAX_INCLUDE_DEPTH:
            raise SourceError(path, None, "ssh config Include nested too deeply")
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError as exc:
            raise SourceError(path, None, f"cannot read ssh config: {exc.strerror}") from None
        current = condition  # the block a nested Include would sit in
        for number, raw in enumerate(text.splitlines(), start=1):
            where = f"{path}:{number}"
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            match = LINE.match(line)
            if not match:
                raise SourceError(path, number, f"cannot parse ssh config line {line!r}")
            keyword, value = match.group(1), match.group(2).strip()
            word = keyword.lower()
            if word == "include":
                for included in _include_paths(value, is_user, path, number):
                    self._read(included, is_user, current, depth + 1)
                continue
            if word in ("host", "match"):
                current = _narrow(condition, word, value)
                if condition:
                    keyword, value = "Match", current or "all"
            self.lines.append((where, keyword, value))
        if depth == 0:
            # The next top-level file (the system config) starts outside any block.
            self.lines.append((f"{path}:end", "Host", "*"))


def _paramiko_keyword(keyword: str, number: int) -> str:
    return f"{CERT_FILE_KEY}{number}" if keyword.lower() == "certificatefile" else keyword


def _as_match(word: str, value: str) -> str:
    """A Host or Match line's condition as Match criteria ('' when it is unconditional)."""
    if word == "host":
        patterns = ",".join(shlex.split(value))
        return "" if patterns == "*" else f"originalhost {patterns}"
    return "" if value.strip().lower() == "all" else value


def _narrow(outer: str, word: str, value: str) -> str:
    # ssh processes a file included inside a block only when that block applies: its own
    # blocks must hold together with the outer condition.
    inner = _as_match(word, value)
    return f"{outer} {inner}".strip()


def _include_paths(value: str, is_user: bool, path: str, number: int) -> list[str]:
    try:
        patterns = shlex.split(value)
    except ValueError:
        raise SourceError(path, number, f"cannot parse Include {value!r}") from None
    found: list[str] = []
    for pattern in patterns:
        pattern = os.path.expanduser(pattern)
        if not os.path.isabs(pattern):
            base = os.path.expanduser("~/.ssh") if is_user else "/etc/ssh"
            pattern = os.path.join(base, pattern)
        found += sorted(p for p in glob.glob(pattern) if os.path.isfile(p))
    return found


def resolve(
    alias: str,
    config: SshConfig,
    options: SshOptions,
    user: str | None = None,
    port: int | None = None,
) -> Target:
    """Where `alias` leads, as `ssh -G` would say; a hostfile `user`/`port` wins."""
    found = config.lookup(alias)
    hostname = found.get("hostname", alias)
    port = port or config.port(found)
    user = user or found.get("user") or getpass.getuser()
    jump = found.get("proxyjump")
    command = found.get("proxycommand")
    tokens = _tokens(alias, hostname, port, user, found)
    user_files = (
        (options.known_hosts,)
        if options.known_hosts
        else _files(found.get("userknownhostsfile"), USER_KNOWN_HOSTS, tokens)
    )
    global_files = _files(found.get("globalknownhostsfile"), GLOBAL_KNOWN_HOSTS, tokens)
    strict = _strictness(found.get("stricthostkeychecking", "ask"))
    if options.accept_new_host_keys:
        strict = "accept-new"  # the flag is ssh's `-o StrictHostKeyChecking=accept-new`
    timeout = (
        options.connect_timeout
        or config.seconds(found, "ConnectTimeout")
        or DEFAULT_CONNECT_TIMEOUT_S
    )
    return Target(
        alias=alias,
        hostname=hostname,
        port=port,
        user=user,
        identity_files=tuple(options.identity_files) + tuple(found.get("identityfile", [])),
        certificate_files=_certificate_files(found, tokens),
        identities_only=_yes(found.get("identitiesonly")),
        proxy_jump=None if not jump or jump.lower() == "none" else jump,
        proxy_command=command if command and command.lower() != "none" else None,
        connect_timeout=timeout,
        keepalive_s=config.seconds(found, "ServerAliveInterval"),
        trust=HostTrust(
            user_files=user_files,
            global_files=global_files,
            strict=strict,
            key_alias=found.get("hostkeyalias"),
            check_host_ip=_yes(found.get("checkhostip")),
            hash_known_hosts=_yes(found.get("hashknownhosts")),
        ),
    )


def _certificate_files(found: paramiko.SSHConfigDict, tokens: dict[str, str]) -> tuple[str, ...]:
    """Every CertificateFile that applies, in the order ssh reads them, each once."""
    files: list[str] = []
    for keyword, value in found.items():  # in the order the lines were read
        if keyword.startswith(CERT_FILE_KEY):
            path = os.path.expanduser(expand_tokens(value, tokens))
            if path not in files:
                files.append(path)
    return tuple(files)


def _yes(value: str | None) -> bool:
    return (value or "").lower() in ("yes", "true")


def _strictness(value: str) -> str:
    value = value.lower()
    if value in ("no", "off", "false"):
        return "no"
    return "accept-new" if value == "accept-new" else "yes"


def _files(value: str | None, default: tuple[str, ...], tokens: dict[str, str]) -> tuple[str, ...]:
    names = shlex.split(value) if value else list(default)
    if [n.lower() for n in names] == ["none"]:
        return ()
    return tuple(os.path.expanduser(expand_tokens(n, tokens)) for n in names)


def _tokens(
    alias: str, hostname: str, port: int, user: str, found: paramiko.SSHConfigDict
) -> dict[str, str]:
    local = socket.gethostname()
    jump = found.get("proxyjump") or ""
    return {
        "%": "%",
        "d": os.path.expanduser("~"),
        "h": hostname,
        "n": alias,
        "p": str(port),
        "r": user,
        "u": getpass.getuser(),
        "i": str(os.getuid()),
        "L": local.split(".")[0],
        "l": local,
        "k": found.get("hostkeyalias") or alias,
        "C": hashlib.sha1(f"{local}{hostname}{port}{user}{jump}".encode()).hexdigest(),
    }


def expand_tokens(value: str, tokens: dict[str, str]) -> str:
    """ssh's percent_expand: `%x` from `tokens`; an unknown token is left as written."""
    return re.sub(r"%(.)", lambda m: tokens.get(m.group(1), m.group(0)), value)
