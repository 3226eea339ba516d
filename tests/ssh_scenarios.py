"""The ssh setups tests/cluster/test_ssh_fidelity.py runs both OpenSSH and the orchestrator against.

Each scenario writes a HOME (ssh config, known_hosts files) for a 3-node lab cluster whose
sshd also listens on port 2222 and presents host certificates signed by the fleet's CA:
node0's names its name and address, node1's names another host, node2's has expired. The
sshd also trusts a user CA (TrustedUserCAKeys): `holder`, a key listed in no
authorized_keys, logs in only with a certificate of that CA naming root.
`expect` is the outcome per host (None: connects), so a scenario cannot pass by accident.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.lab.cluster import Cluster, Node
from tests.lab.ssh import KeyPair

JUMP_PORT = 2222


@dataclass(frozen=True)
class Fleet:
    cluster: Cluster
    client: KeyPair  # authorized on every node
    stranger: KeyPair  # authorized nowhere
    ca_public: str  # 'ssh-ed25519 AAAA...' of the CA that signed the host certificates
    wrong: tuple[str, ...]  # per node, a key that is not its host key (for changed keys)
    holder: KeyPair  # authorized nowhere, but certified by the user CA
    # `-cert.pub` texts by the user CA: holder's for root ("good"), expired, for alice only;
    # client's, expired ("client_expired")
    user_certs: dict[str, str]

    @property
    def n(self) -> tuple[Node, ...]:
        return self.cluster.nodes

    @property
    def glob(self) -> str:
        return f"{self.cluster.name}-node*"

    @property
    def ghost(self) -> str:
        return str(self.cluster.subnet.network_address + 250)


@dataclass(frozen=True)
class Home:
    root: Path

    def write(self, relative: str, text: str) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_text(text)
        path.chmod(0o600)
        return path

    def lock(self, relative: str, source: str) -> None:
        """A passphrase-protected copy of a private key, without a `.pub` beside it."""
        (self.root / relative).write_text((self.root / source).read_text())
        (self.root / relative).chmod(0o600)
        subprocess.run(
            [
                "ssh-keygen",
                "-q",
                "-p",
                "-P",
                "",
                "-N",
                "not typed",
                "-f",
                str(self.root / relative),
            ],
            check=True,
            capture_output=True,
        )

    def hash(self, relative: str) -> None:
        """Hash a known_hosts file with OpenSSH's own `ssh-keygen -H`."""
        subprocess.run(
            ["ssh-keygen", "-q", "-H", "-f", str(self.root / relative)],
            check=True,
            capture_output=True,
        )
        (self.root / f"{relative}.old").unlink()


@dataclass(frozen=True)
class Scenario:
    name: str
    build: Callable[[Fleet, Home], None]
    expect: tuple[str | None, ...]  # per host: None (connects) or the refusal reason
    hosts: Callable[[Fleet], list[str]] = lambda f: [n.name for n in f.n]
    ssh_args: tuple[str, ...] = ()
    our_args: tuple[str, ...] = ()
    unverified: tuple[int, ...] = ()  # hosts (by position) let in without a verified key
    recorded: tuple[str, ...] = ()  # known_hosts files both tools must have written alike
    agent: tuple[str, ...] = ()  # keys (in HOME) an ssh-agent holds for both tools


def block(f: Fleet, *extra: str, hosts: str | None = None) -> str:
    lines = [
        f"Host {hosts or f.glob}",
        "    User root",
        "    IdentityFile ~/keys/cluster",
        *(f"    {line}" for line in extra),
    ]
    return "\n".join(lines) + "\n"


def lines(*entries: tuple[str, str]) -> str:
    return "".join(f"{names} {key}\n" for names, key in entries)


def known(nodes, name=lambda n: n.name) -> str:
    return lines(*((name(n), n.host_public_key) for n in nodes))


def _cfg(h: Home, text: str) -> None:
    h.write(".ssh/config", text)


def _strict_yes(f: Fleet, h: Home) -> None:
    _cfg(h, block(f, "StrictHostKeyChecking yes"))


def _tokens(f: Fleet, h: Home) -> None:
    _cfg(h, block(f, "UserKnownHostsFile %d/kh/%r-%h-%p"))
    for node in f.n[:2]:
        h.write(f"kh/root-{node.name}-22", known([node]))


def _changed(index: int, strict: str) -> Callable[[Fleet, Home], None]:
    def build(f: Fleet, h: Home) -> None:
        _cfg(h, block(f, f"StrictHostKeyChecking {strict}"))
        h.write(
            ".ssh/known_hosts",
            known(f.n[:index]) + lines((f.n[index].name, f.wrong[index])) + known(f.n[index + 1 :]),
        )

    return build


def _hashed(f: Fleet, h: Home) -> None:
    _cfg(h, block(f, "UserKnownHostsFile ~/kh/hashed"))
    h.write("kh/hashed", known(f.n))
    h.hash("kh/hashed")


def _port(f: Fleet, h: Home) -> None:
    _cfg(h, block(f, f"Port {JUMP_PORT}"))
    h.write(
        ".ssh/known_hosts", known(f.n[:2], lambda n: f"[{n.name}]:{JUMP_PORT}") + known(f.n[2:])
    )
    h.hash(".ssh/known_hosts")


def _port_changed(f: Fleet, h: Home) -> None:
    _cfg(h, block(f, f"Port {JUMP_PORT}"))
    h.write(
        ".ssh/known_hosts",
        known(f.n[:2], lambda n: f"[{n.name}]:{JUMP_PORT}") + lines((f.n[2].name, f.wrong[2])),
    )


def _alias(f: Fleet, h: Home) -> None:
    _cfg(h, "".join(f"Host {n.name}\n    HostKeyAlias cluster-{n.index}\n" for n in f.n) + block(f))
    h.write(".ssh/known_hosts", known(f.n[:2], lambda n: f"cluster-{n.index}") + known(f.n[2:]))


def _ca(pattern: str, plain: str = "", revoked: str = "") -> Callable[[Fleet, Home], None]:
    def build(f: Fleet, h: Home) -> None:
        _cfg(h, block(f))
        text = f"@cert-authority {pattern.replace('GLOB', f.glob)} {f.ca_public}\n"
        if plain == "wrong0-real1":
            text += lines((f.n[0].name, f.wrong[0])) + known(f.n[1:2])
        elif plain == "real1":
            text += known(f.n[1:2])
        if revoked == "ca":
            text += f"@revoked * {f.ca_public}\n"
        h.write(".ssh/known_hosts", text)

    return build


def _revoked_key(f: Fleet, h: Home) -> None:
    _cfg(h, block(f))
    h.write(".ssh/known_hosts", known(f.n) + f"@revoked * {f.n[1].host_public_key}\n")


def _identities_only(f: Fleet, h: Home) -> None:
    _cfg(
        h, f"Host {f.glob}\n    User root\n    IdentityFile ~/keys/other\n    IdentitiesOnly yes\n"
    )
    f.client.write(h.root / ".ssh" / "id_ed25519")  # a default key ssh must not fall back to
    h.write(".ssh/known_hosts", known(f.n))


def _include_glob(f: Fleet, h: Home) -> None:
    _cfg(h, "Include config.d/*.conf\n")
    h.write(".ssh/config.d/10-user.conf", block(f))
    h.write(".ssh/config.d/20-trust.conf", f"Host {f.glob}\n    UserKnownHostsFile ~/kh/site\n")
    h.write(".ssh/config.d/README", "Host *\n    User nobody\n")  # not *.conf: not included
    h.write("kh/site", known(f.n))


def _include_in_block(f: Fleet, h: Home) -> None:
    _cfg(
        h,
        f"Host {f.n[0].name}\n    Include node0.conf\n" + block(f, "UserKnownHostsFile ~/kh/empty"),
    )
    h.write(".ssh/node0.conf", "UserKnownHostsFile ~/kh/good\n")
    h.write("kh/good", known(f.n))


def _match(f: Fleet, h: Home) -> None:
    _cfg(
        h,
        block(f) + f"Match originalhost {f.n[1].name} user root\n"
        "    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n",
    )
    h.write(".ssh/known_hosts", known(f.n[:1]))


def _first_value(f: Fleet, h: Home) -> None:
    _cfg(h, f"Host {f.n[0].name}\n    Port 2\n" + block(f, "Port 22"))
    h.write(".ssh/known_hosts", known(f.n))


def _combined(jump_known: bool) -> Callable[[Fleet, Home], None]:
    def build(f: Fleet, h: Home) -> None:
        _cfg(h, "Include ~/.ssh/cluster.conf\n")
        h.write(
            ".ssh/cluster.conf",
            "".join(f"Host gpu{n.index}\n    HostName {n.address}\n" for n in f.n[1:])
            + f"Host gpu*\n    Port {JUMP_PORT}\n    ProxyJump jump\n"
            f"Host jump\n    HostName {f.n[0].name}\n"
            "Host *\n    User root\n    IdentityFile ~/keys/cluster\n",
        )
        h.write(
            ".ssh/known_hosts",
            known(f.n[1:], lambda n: f"[{n.address}]:{JUMP_PORT}")
            + (known(f.n[:1]) if jump_known else ""),
        )
        h.hash(".ssh/known_hosts")

    return build


def _check_host_ip(f: Fleet, h: Home) -> None:
    # UpdateHostKeys (on by default) would let ssh rewrite the address's line after login;
    # the orchestrator does not learn keys that way, so the files are compared without it.
    _cfg(h, block(f, "CheckHostIP yes", "UpdateHostKeys no"))
    h.write(".ssh/known_hosts", known(f.n) + lines((f.n[1].address, f.wrong[1])))


def _timeout(f: Fleet, h: Home) -> None:
    _cfg(
        h,
        f"Host ghost\n    HostName {f.ghost}\n"
        + block(f, "ConnectTimeout 2", "ServerAliveInterval 5", hosts=f"{f.glob} ghost"),
    )
    h.write(".ssh/known_hosts", known(f.n))


def _user_cert(
    key: str, *certificate_files: str, beside: str = "", extra: tuple[str, ...] = ()
) -> Callable[[Fleet, Home], None]:
    """Login as root with `key`, its CertificateFiles (~/certs/NAME.pub, NAME among the
    fleet's user certificates) and the certificate NAME `beside` it (`KEY-cert.pub`)."""

    def build(f: Fleet, h: Home) -> None:
        for name, text in f.user_certs.items():
            h.write(f"certs/{name}.pub", text)
        if beside:
            h.write(f"keys/{key}-cert.pub", f.user_certs[beside])
        _cfg(
            h,
            f"Host {f.glob}\n    User root\n    IdentityFile ~/keys/{key}\n"
            + "".join(f"    CertificateFile {path}\n" for path in certificate_files)
            + "".join(f"    {line}\n" for line in extra),
        )
        h.write(".ssh/known_hosts", known(f.n))

    return build


def _user_cert_per_host(f: Fleet, h: Home) -> None:
    _user_cert("holder", beside="good")(f, h)
    _cfg(
        h,
        f"Host {f.n[0].name}\n    CertificateFile ~/certs/expired.pub\n"
        f"Host {f.n[1].name}\n    CertificateFile ~/certs/expired.pub\n"
        "    CertificateFile ~/certs/good.pub\n"
        f"Host {f.glob}\n    User root\n    IdentityFile ~/keys/holder\n",
    )


def _user_cert_tokens(f: Fleet, h: Home) -> None:
    # node2 has no certificate under its name; the one beside the key is not read either,
    # since a CertificateFile is named.
    _user_cert("holder", "~/certs/%r-%h.pub", beside="good")(f, h)
    for node in f.n[:2]:
        h.write(f"certs/root-{node.name}.pub", f.user_certs["good"])


def _agent_for_locked_key(identity: str) -> Callable[[Fleet, Home], None]:
    def build(f: Fleet, h: Home) -> None:
        h.lock("keys/locked", "keys/cluster")
        _cfg(
            h,
            f"Host {f.glob}\n    User root\n    IdentityFile ~/keys/{identity}\n"
            "    IdentitiesOnly yes\n",
        )
        h.write(".ssh/known_hosts", known(f.n))

    return build


SCENARIOS = [
    Scenario(
        "user_known_hosts_file",
        lambda f, h: (
            _cfg(
                h,
                block(
                    f, "UserKnownHostsFile ~/keys/cluster_known_hosts", "StrictHostKeyChecking yes"
                ),
            ),
            h.write("keys/cluster_known_hosts", known(f.n)),
        ),
        (None, None, None),
    ),
    Scenario(
        "default_known_hosts_file",
        lambda f, h: (_cfg(h, block(f)), h.write(".ssh/known_hosts", known(f.n[:2]))),
        (None, None, "unknown"),
    ),
    Scenario(
        "several_user_known_hosts_files",
        lambda f, h: (
            _cfg(h, block(f, "UserKnownHostsFile ~/kh/a ~/kh/b")),
            h.write("kh/a", known(f.n[:1])),
            h.write("kh/b", known(f.n[1:2])),
        ),
        (None, None, "unknown"),
    ),
    Scenario("tokens_in_known_hosts_path", _tokens, (None, None, "unknown")),
    Scenario(
        "global_known_hosts_file",
        lambda f, h: (
            _cfg(
                h,
                block(
                    f, "UserKnownHostsFile ~/kh/empty", "GlobalKnownHostsFile ~/site_known_hosts"
                ),
            ),
            h.write("site_known_hosts", known(f.n)),
        ),
        (None, None, None),
    ),
    Scenario("strict_yes_refuses_unknown", _strict_yes, ("unknown",) * 3),
    Scenario(
        "strict_ask_behaves_as_yes",
        lambda f, h: _cfg(h, block(f, "StrictHostKeyChecking ask")),
        ("unknown",) * 3,
    ),
    Scenario(
        "accept_new_records_in_first_file",
        lambda f, h: (
            _cfg(
                h,
                block(
                    f,
                    "StrictHostKeyChecking accept-new",
                    "UserKnownHostsFile ~/kh/first ~/kh/second",
                ),
            ),
            h.write("kh/second", known(f.n[:1])),
        ),
        (None, None, None),
        recorded=("kh/first",),
    ),
    Scenario(
        "accept_new_refuses_changed",
        _changed(1, "accept-new"),
        (None, "changed", None),
        recorded=(".ssh/known_hosts",),
    ),
    Scenario(
        "accept_new_from_the_command_line",
        _strict_yes,
        (None, None, None),
        ssh_args=("-o", "StrictHostKeyChecking=accept-new"),
        our_args=("--accept-new-host-keys",),
        recorded=(".ssh/known_hosts",),
    ),
    Scenario(
        "strict_no_with_dev_null",
        lambda f, h: _cfg(h, block(f, "StrictHostKeyChecking no", "UserKnownHostsFile /dev/null")),
        (None, None, None),
        unverified=(0, 1, 2),
    ),
    Scenario(
        "strict_no_passes_changed_key", _changed(0, "no"), (None, None, None), unverified=(0,)
    ),
    Scenario("changed_key_refused", _changed(2, "yes"), (None, None, "changed")),
    Scenario("hashed_known_hosts", _hashed, (None, None, None)),
    Scenario("non_22_port_falls_back_to_bare_name", _port, (None, None, None)),
    Scenario("non_22_port_bare_name_changed", _port_changed, (None, None, "unknown")),
    Scenario("host_key_alias", _alias, (None, None, "unknown")),
    Scenario("cert_authority", _ca("GLOB"), (None, "unknown", "unknown")),
    Scenario("cert_authority_for_other_hosts", _ca("*.example.org"), ("unknown",) * 3),
    Scenario("cert_or_plain_key", _ca("GLOB", plain="real1"), (None, None, "unknown")),
    Scenario(
        "valid_cert_beats_changed_plain_key",
        _ca("*", plain="wrong0-real1"),
        (None, None, "unknown"),
    ),
    Scenario("revoked_key", _revoked_key, (None, "revoked", None)),
    Scenario("revoked_ca", _ca("GLOB", plain="real1", revoked="ca"), ("revoked",) * 3),
    Scenario("identities_only_no_default_key", _identities_only, ("auth",) * 3),
    Scenario("include_glob_relative", _include_glob, (None, None, None)),
    Scenario("include_inside_host_block", _include_in_block, (None, "unknown", "unknown")),
    Scenario("match_originalhost_and_user", _match, (None, None, "unknown"), unverified=(1,)),
    Scenario("first_value_wins", _first_value, ("unreachable", None, None)),
    Scenario(
        "alias_include_hashed_port_jump",
        _combined(True),
        (None, None),
        hosts=lambda f: ["gpu1", "gpu2"],
    ),
    Scenario(
        "jump_host_key_unknown",
        _combined(False),
        ("unknown", "unknown"),
        hosts=lambda f: ["gpu1", "gpu2"],
    ),
    Scenario(
        "check_host_ip_skipped_for_certificates",
        _check_host_ip,
        (None, None, None),
        recorded=(".ssh/known_hosts",),
    ),
    Scenario("user_cert_certificate_file_with_tokens", _user_cert_tokens, (None, None, "auth")),
    Scenario(
        "user_cert_beside_identity_file", _user_cert("holder", beside="good"), (None, None, None)
    ),
    Scenario(
        "user_cert_expired_refused", _user_cert("holder", "~/certs/expired.pub"), ("auth",) * 3
    ),
    Scenario(
        "user_cert_wrong_principal_refused", _user_cert("holder", beside="alice"), ("auth",) * 3
    ),
    Scenario(
        "certificate_file_replaces_cert_beside_key",
        _user_cert("holder", "~/certs/expired.pub", beside="good"),
        ("auth",) * 3,
    ),
    Scenario("certificate_files_add_up_per_host", _user_cert_per_host, ("auth", None, None)),
    Scenario(
        "plain_key_before_its_expired_cert",
        _user_cert("cluster", beside="client_expired"),
        (None, None, None),
    ),
    Scenario(
        "user_cert_without_its_key",
        _user_cert("other", "~/certs/good.pub", extra=("IdentitiesOnly yes",)),
        ("auth",) * 3,
    ),
    Scenario(
        "identities_only_agent_key_of_identity_file",
        _agent_for_locked_key("locked"),
        (None, None, None),
        agent=("keys/cluster",),
    ),
    Scenario(
        "identities_only_ignores_other_agent_keys",
        _agent_for_locked_key("other"),
        ("auth",) * 3,
        agent=("keys/cluster",),
    ),
    Scenario(
        "connect_timeout_unreachable",
        _timeout,
        (None, "unreachable"),
        hosts=lambda f: [f.n[0].name, "ghost"],
    ),
]
