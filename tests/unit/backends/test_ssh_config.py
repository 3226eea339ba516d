"""What paramiko's SSHConfig lacks and client_config.py adds: Include, tokens, trust
settings, warnings.

(tests/cluster/test_ssh_fidelity.py checks the same against real `ssh -G` on the lab cluster.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.backends.ssh.client_config import SshConfig, expand_tokens, resolve
from orchestrator.errors import SourceError
from orchestrator.options.reaching import SshOptions


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def target(home: Path, text: str, alias: str = "node1", **options):
    config = write(home / ".ssh" / "config", text)
    return resolve(alias, SshConfig(str(config)), SshOptions(**options))


def test_include_globs_relative_to_dot_ssh_in_sorted_order(home: Path) -> None:
    write(home / ".ssh" / "conf.d" / "20-b.conf", "Host node*\n    User second\n    Port 2200\n")
    write(home / ".ssh" / "conf.d" / "10-a.conf", "Host node*\n    User first\n")
    write(home / ".ssh" / "conf.d" / "notes.txt", "Host *\n    User ignored\n")
    found = target(home, "Include conf.d/*.conf missing/*.conf\nHost *\n    Port 22\n")
    assert (found.user, found.port) == ("first", 2200)


def test_include_inside_a_block_applies_only_to_that_block(home: Path) -> None:
    write(home / ".ssh" / "node1.conf", "UserKnownHostsFile ~/kh/one\nHost *\n    User deep\n")
    text = "Host node1\n    Include node1.conf\nHost *\n    User plain\n"
    one = target(home, text, "node1")
    other = target(home, text, "node2")
    assert one.trust.user_files == (f"{home}/kh/one",) and one.user == "deep"
    # node2 is not in the block: neither the included file nor its own `Host *` applies.
    assert other.user == "plain"
    assert other.trust.user_files == (f"{home}/.ssh/known_hosts", f"{home}/.ssh/known_hosts2")


def test_match_and_first_value_wins(home: Path) -> None:
    text = (
        "Host node1\n    Port 2201\nMatch originalhost node* user root\n    Port 2299\n"
        "    StrictHostKeyChecking no\nHost *\n    User root\n"
    )
    assert target(home, text, "node1").port == 2201
    second = target(home, text, "node2")
    assert (second.port, second.user, second.trust.strict) == (2299, "root", "no")


def test_known_hosts_settings_and_their_tokens(home: Path) -> None:
    found = target(
        home,
        "Host node1\n    HostName 10.0.0.1\n    User alice\n    Port 2222\n"
        '    UserKnownHostsFile %d/kh/%r@%h:%p ~/kh/%n "~/with space"\n'
        "    GlobalKnownHostsFile none\n    HostKeyAlias pool\n    CheckHostIP yes\n"
        "    HashKnownHosts yes\n    StrictHostKeyChecking accept-new\n",
    )
    assert found.trust.user_files == (
        f"{home}/kh/alice@10.0.0.1:2222",
        f"{home}/kh/node1",
        f"{home}/with space",
    )
    assert found.trust.global_files == ()
    assert (
        found.trust.key_alias,
        found.trust.check_host_ip,
        found.trust.hash_known_hosts,
        found.trust.strict,
    ) == ("pool", True, True, "accept-new")


@pytest.mark.parametrize(
    ("value", "strict"),
    [("yes", "yes"), ("ask", "yes"), ("no", "no"), ("off", "no"), ("accept-new", "accept-new")],
)
def test_strict_host_key_checking_values(home: Path, value: str, strict: str) -> None:
    assert target(home, f"StrictHostKeyChecking {value}\n").trust.strict == strict


def test_flags_win_over_the_config_and_hostfile_user_port_win(home: Path) -> None:
    text = (
        "Host node1\n    User cfg\n    Port 2222\n    StrictHostKeyChecking yes\n"
        "    UserKnownHostsFile ~/kh/cfg\n    ConnectTimeout 3\n    IdentityFile ~/k\n"
    )
    config = SshConfig(str(write(home / ".ssh" / "config", text)))
    first = str(write(home / "first", "a key\n"))  # --identity must name a file that is there
    flags = SshOptions(
        known_hosts="/tmp/flag_kh",
        accept_new_host_keys=True,
        connect_timeout=7.0,
        identity_files=(first,),
    )
    found = resolve("node1", config, flags, user="hostfile", port=2200)
    assert (found.user, found.port, found.connect_timeout) == ("hostfile", 2200, 7.0)
    assert found.trust.user_files == ("/tmp/flag_kh",) and found.trust.strict == "accept-new"
    assert found.identity_files == (first, f"{home}/k")
    plain = resolve("node1", config, SshOptions())
    assert (plain.user, plain.port, plain.connect_timeout) == ("cfg", 2222, 3.0)


def test_identities_only_keepalive_and_proxy_settings(home: Path) -> None:
    found = target(
        home,
        "Host node1\n    IdentitiesOnly yes\n    ServerAliveInterval 15\n"
        "    ProxyJump admin@bastion:2022\n",
    )
    assert found.identities_only and found.keepalive_s == 15.0
    assert found.proxy_jump == "admin@bastion:2022" and found.proxy_command is None
    bare = target(home, "Host node1\n    ProxyJump none\n")
    assert not bare.identities_only and bare.keepalive_s is None and bare.proxy_jump is None


def test_unsupported_keyword_warns_once_with_file_and_line(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write(
        home / ".ssh" / "config",
        "Host node*\n    User root\n"
        "    KnownHostsCommand /usr/bin/fetch-keys %H\n    LogLevel ERROR\n"
        "    VerifyHostKeyDNS no\n",
    )
    parsed = SshConfig(str(config))
    for alias in ("node1", "node2", "node1"):
        resolve(alias, parsed, SshOptions())
    err = capsys.readouterr().err
    assert err.count("warning:") == 1, err
    assert f"{config}:3: ssh option 'knownhostscommand' is not supported here" in err


def test_unparsable_line_names_file_and_line(home: Path) -> None:
    write(home / ".ssh" / "bad.conf", "Host x\n    JustOneWord\n")
    with pytest.raises(SourceError, match=r"bad\.conf:2: cannot parse ssh config line"):
        SshConfig(str(write(home / ".ssh" / "config", "Include bad.conf\n")))


def test_percent_tokens() -> None:
    tokens = {"h": "node1", "p": "22", "%": "%"}
    assert expand_tokens("%h-%p-%%-%z", tokens) == "node1-22-%-%z"
