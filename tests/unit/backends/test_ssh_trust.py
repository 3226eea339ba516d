"""known_hosts lines, host certificates and the trust decision, without a network.

Keys and certificates are made by OpenSSH's own ssh-keygen, so the parsing is checked
against the real formats. tests/cluster/test_ssh_fidelity.py compares whole decisions with ssh.
"""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import paramiko
import pytest

from orchestrator.backends.ssh import known_hosts
from orchestrator.backends.ssh.certs import host_certificate
from orchestrator.backends.ssh.client_config import HostTrust, Target
from orchestrator.backends.ssh.trust import HostKeyRefused, Trust

pytestmark = pytest.mark.openssh


def keygen(path: Path) -> paramiko.PKey:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return paramiko.Ed25519Key.from_private_key_file(str(path))


def certified(
    tmp_path: Path,
    key_path: Path,
    principals: str,
    validity: str = "always:forever",
    ca: str = "ca",
) -> paramiko.PKey:
    """The host key as a server presents it with its certificate (paramiko's view)."""
    subprocess.run(
        [
            "ssh-keygen",
            "-q",
            "-s",
            str(tmp_path / ca),
            "-I",
            "test",
            "-h",
            "-n",
            principals,
            "-V",
            validity,
            f"{key_path}.pub",
        ],
        check=True,
    )
    key = paramiko.Ed25519Key.from_private_key_file(str(key_path))
    key.load_certificate(f"{key_path}-cert.pub")
    return key


def entry(name: str, key: paramiko.PKey, marker: str = "") -> str:
    return f"{marker} {name} {key.get_name()} {key.get_base64()}\n".lstrip()


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, paramiko.PKey]:
    return {name: keygen(tmp_path / name) for name in ("host", "other", "ca", "ca2")}


def make_target(tmp_path: Path, strict: str = "yes", port: int = 22, **trust) -> Target:
    settings = HostTrust(
        user_files=(str(tmp_path / "known_hosts"),),
        global_files=(),
        strict=strict,
        key_alias=None,
        check_host_ip=False,
        hash_known_hosts=False,
    )
    return Target(
        "node1", "node1", port, "root", (), False, None, None, 5.0, None, replace(settings, **trust)
    )


def test_patterns_negation_wildcards_brackets_and_hashes() -> None:
    assert known_hosts.pattern_list_matches("node*,!node9", "node1")
    assert not known_hosts.pattern_list_matches("node*,!node9", "node9")
    assert known_hosts.pattern_list_matches("[node?]:2222", "[node1]:2222")
    assert not known_hosts.pattern_list_matches("[node1]:2222", "node1")
    hashed = known_hosts.hashed_name("[node1]:2222")
    line = known_hosts.parse(
        f"{hashed} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB6d9xxTGU8NPbsWZp"
        "6uJVrpu8f8x6yRmS66uOqeP0NM\n",
        "f",
    )[0]
    assert line.matches("[node1]:2222") and not line.matches("node1")


def test_parse_markers_skips_junk_and_names_lines(keys) -> None:
    text = (
        "# comment\n\n"
        + entry("node1", keys["host"])
        + entry("*", keys["ca"], "@cert-authority")
        + "@bogus * ssh-ed25519 AAAA\nnode2 ssh-rsa notbase64!\n"
        + entry("*", keys["other"], "@revoked")
    )
    parsed = known_hosts.parse(text, "kh")
    assert [(k.marker, k.where) for k in parsed] == [
        ("", "kh:3"),
        ("@cert-authority", "kh:4"),
        ("@revoked", "kh:7"),
    ]


def test_append_hashed_is_read_back(tmp_path: Path, keys) -> None:
    files = known_hosts.KnownHostsFiles()
    path = str(tmp_path / "sub" / "kh")
    files.append(path, ("node1", "10.0.0.1"), keys["host"].asbytes(), hashed=True)
    lines = Path(path).read_text().splitlines()
    assert len(lines) == 2 and all(line.startswith("|1|") for line in lines)
    found = known_hosts.KnownHostsFiles().keys((path,))
    assert [k.matches("node1") for k in found] == [True, False]
    assert (Path(path).stat().st_mode & 0o777) == 0o600


def test_certificate_fields_and_problems(tmp_path: Path, keys) -> None:
    good = host_certificate(certified(tmp_path, tmp_path / "host", "node1,*.cluster"))
    assert good is not None and good.principals == ("node1", "*.cluster")
    assert good.ca_blob == keys["ca"].asbytes()
    assert good.problem("node1") is None and good.problem("gpu7.cluster") is None
    assert "not among its principals" in good.problem("node2")
    expired = host_certificate(certified(tmp_path, tmp_path / "host", "node1", "20200101:20200102"))
    assert "validity" in expired.problem("node1")
    forged = replace(good, signed=good.signed.replace(b"node1", b"node2"))
    assert "signature does not verify" in forged.problem("node1")
    assert host_certificate(keys["host"]) is None


def write_known(tmp_path: Path, text: str) -> None:
    (tmp_path / "known_hosts").write_text(text)


def test_plain_known_changed_unknown(tmp_path: Path, keys) -> None:
    write_known(tmp_path, entry("node1", keys["other"]))
    with pytest.raises(HostKeyRefused) as changed:
        Trust().check(make_target(tmp_path), "node1", keys["host"], None)
    assert changed.value.reason == "changed" and changed.value.detail.endswith("known_hosts:1")
    write_known(tmp_path, entry("node2", keys["host"]))
    with pytest.raises(HostKeyRefused, match="unknown"):
        Trust().check(make_target(tmp_path), "node1", keys["host"], None)
    write_known(tmp_path, entry("node?", keys["host"]))
    Trust().check(make_target(tmp_path), "node1", keys["host"], None)


def test_certificate_trusted_then_revoked_ca(tmp_path: Path, keys) -> None:
    presented = certified(tmp_path, tmp_path / "host", "node1")
    write_known(tmp_path, entry("node*", keys["ca"], "@cert-authority"))
    Trust().check(make_target(tmp_path), "node1", presented, None)
    write_known(tmp_path, entry("other.example", keys["ca"], "@cert-authority"))
    with pytest.raises(HostKeyRefused, match="unknown"):
        Trust().check(make_target(tmp_path), "node1", presented, None)
    write_known(
        tmp_path, entry("*", keys["ca"], "@cert-authority") + entry("*", keys["ca"], "@revoked")
    )
    with pytest.raises(HostKeyRefused, match="revoked"):
        Trust().check(make_target(tmp_path), "node1", presented, None)


def test_accept_new_records_hashed_and_no_is_reported(
    tmp_path: Path, keys, capsys: pytest.CaptureFixture[str]
) -> None:
    trust = Trust()
    trust.check(
        make_target(tmp_path, "accept-new", hash_known_hosts=True), "node1", keys["host"], None
    )
    assert (tmp_path / "known_hosts").read_text().startswith("|1|")
    trust.check(make_target(tmp_path), "node1", keys["host"], None)  # now known
    write_known(tmp_path, entry("node1", keys["other"]))
    trust = Trust()  # one command reads each file once
    for shown in ("node1", "alias-b"):
        trust.check(make_target(tmp_path, "no"), shown, keys["host"], None)
    trust.report()
    trust.report()
    err = capsys.readouterr().err
    assert err.count("NOT verified") == 1 and "for: alias-b, node1" in err


def test_port_fallback_alias_and_host_ip(tmp_path: Path, keys) -> None:
    write_known(tmp_path, entry("node1", keys["host"]))
    Trust().check(make_target(tmp_path, port=2222), "node1", keys["host"], None)
    with pytest.raises(HostKeyRefused, match="unknown"):
        Trust().check(
            make_target(tmp_path, port=2222, key_alias="pool1"), "node1", keys["host"], None
        )
    write_known(tmp_path, entry("node1", keys["host"]) + entry("10.0.0.1", keys["other"]))
    with pytest.raises(HostKeyRefused, match="changed") as changed:
        Trust().check(make_target(tmp_path, check_host_ip=True), "node1", keys["host"], "10.0.0.1")
    assert changed.value.name == "10.0.0.1"
    write_known(tmp_path, entry("node1", keys["host"]))
    Trust().check(make_target(tmp_path, check_host_ip=True), "node1", keys["host"], "10.0.0.2")
    assert "10.0.0.2" in (tmp_path / "known_hosts").read_text()


def test_offered_algorithms_follow_known_key_types(tmp_path: Path, keys) -> None:
    write_known(tmp_path, "")
    assert Trust().algorithms(make_target(tmp_path))[0] == "ssh-ed25519-cert-v01@openssh.com"
    rsa = paramiko.RSAKey.generate(1024)
    write_known(tmp_path, entry("node1", rsa))
    offered = Trust().algorithms(make_target(tmp_path))
    assert offered[:4] == (
        "rsa-sha2-512-cert-v01@openssh.com",
        "rsa-sha2-256-cert-v01@openssh.com",
        "rsa-sha2-512",
        "rsa-sha2-256",
    )
