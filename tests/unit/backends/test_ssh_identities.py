"""Which keys and user certificates are offered for login, in ssh's order, without a network.

Keys and certificates are made by OpenSSH's own ssh-keygen. tests/cluster/test_ssh_fidelity.py
logs in with them on the lab cluster next to real ssh (certificate-only sshd).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import paramiko
import pytest

from orchestrator.backends.ssh import notices
from orchestrator.backends.ssh.client_config import SshConfig, resolve
from orchestrator.backends.ssh.identities import offers
from orchestrator.options.reaching import SshOptions

pytestmark = pytest.mark.openssh


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / "k").mkdir()
    monkeypatch.setattr(notices, "_seen", set())
    return tmp_path


def keygen(path: Path, passphrase: str = "") -> paramiko.PKey:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(path)], check=True
    )
    return paramiko.PKey.from_type_string(*_public(path.with_name(path.name + ".pub")))


def _public(path: Path) -> tuple[str, bytes]:
    blob = paramiko.pkey.PublicBlob.from_file(str(path))
    return blob.key_type, blob.key_blob


def sign(home: Path, key: Path, out: Path, host: bool = False) -> Path:
    """Certify `key`.pub with the CA in home/k/ca and put the certificate at `out`."""
    if not (home / "k" / "ca").exists():
        keygen(home / "k" / "ca")
    argv = ["ssh-keygen", "-q", "-s", str(home / "k" / "ca"), "-I", "t", "-n", "root"]
    subprocess.run([*argv, *(["-h"] if host else []), f"{key}.pub"], check=True)
    Path(f"{key}-cert.pub").rename(out)
    return out


def target(home: Path, text: str, alias: str = "node1"):
    config = home / ".ssh" / "config"
    config.write_text(text)
    return resolve(alias, SshConfig(str(config)), SshOptions())


def shown(keys: list[paramiko.PKey]) -> list[tuple[str, bytes]]:
    """What each offer presents: (key type, blob): a certificate or a plain key."""
    return [
        (k.public_blob.key_type, k.public_blob.key_blob)
        if k.public_blob
        else (k.get_name(), k.asbytes())
        for k in keys
    ]


def plain(key: paramiko.PKey) -> tuple[str, bytes]:
    return key.get_name(), key.asbytes()


def test_certificate_files_add_up_in_order_with_tokens_and_tilde(home: Path, capsys) -> None:
    found = target(
        home,
        "Host node*\n    CertificateFile ~/c/%h-%r.pub\n"
        "    CertificateFile /etc/c/one\nHost *\n    CertificateFile /etc/c/one\n"
        "    CertificateFile %d/two\n    User root\n",
    )
    assert found.certificate_files == (f"{home}/c/node1-root.pub", "/etc/c/one", f"{home}/two")
    assert target(home, "Host other\n    CertificateFile /x\n").certificate_files == ()
    assert "not supported" not in capsys.readouterr().err


def test_certificate_file_first_then_its_key_and_no_implicit_certificate(home: Path) -> None:
    key = keygen(home / "k" / "id")
    cert = sign(home, home / "k" / "id", home / "k" / "mine.pub")
    sign(home, home / "k" / "id", home / "k" / "id-cert.pub")  # not read: a file is named
    found = offers(
        target(home, f"Host *\n    IdentityFile ~/k/id\n    CertificateFile {cert}\n"), []
    )
    assert shown(found) == [_public(cert), plain(key)]
    assert found[0].asbytes() == key.asbytes()  # the certificate is signed by its own key


def test_implicit_certificate_follows_its_key(home: Path) -> None:
    first = keygen(home / "k" / "first")
    second = keygen(home / "k" / "second")
    cert = sign(home, home / "k" / "second", home / "k" / "second-cert.pub")
    found = offers(
        target(home, "Host *\n    IdentityFile ~/k/first\n    IdentityFile ~/k/second\n"), []
    )
    assert shown(found) == [plain(first), plain(second), _public(cert)]


def test_default_identity_and_its_certificate_when_no_identity_file(home: Path) -> None:
    key = keygen(home / ".ssh" / "id_ed25519")
    cert = sign(home, home / ".ssh" / "id_ed25519", home / ".ssh" / "id_ed25519-cert.pub")
    assert shown(offers(target(home, "Host *\n    User root\n"), [])) == [plain(key), _public(cert)]


def test_certificate_without_its_key_is_skipped_with_one_warning(home: Path, capsys) -> None:
    keygen(home / "k" / "held")
    keygen(home / "k" / "elsewhere")
    cert = sign(home, home / "k" / "elsewhere", home / "k" / "orphan.pub")
    host = sign(home, home / "k" / "held", home / "k" / "host.pub", host=True)
    found = offers(
        target(
            home,
            f"Host *\n    IdentityFile ~/k/held\n"
            f"    CertificateFile {cert}\n    CertificateFile {host}\n"
            "    CertificateFile ~/k/missing.pub\n",
        ),
        [],
    )
    assert [k.public_blob for k in found] == [None]  # the plain key only
    err = capsys.readouterr().err
    assert (
        f"CertificateFile {cert} certifies a key that is neither an identity file nor "
        "in the ssh-agent" in err
    )
    assert f"CertificateFile {host} holds no user certificate" in err
    assert "missing" not in err  # as ssh: a CertificateFile that does not exist is skipped


def test_agent_keys_that_are_identity_files_come_first(home: Path) -> None:
    listed = keygen(home / "k" / "listed")
    other = keygen(home / "k" / "agent-only")
    text = "Host *\n    IdentityFile ~/k/listed\n"
    # The agent is the boundary: its keys stand in as the keys it would sign with.
    assert shown(offers(target(home, text), [other, listed])) == [plain(listed), plain(other)]
    only = offers(target(home, text + "    IdentitiesOnly yes\n"), [other, listed])
    assert only == [listed]  # the agent's copy, not the file read a second time


def test_passphrase_key_is_used_through_the_agent_only(home: Path) -> None:
    key = keygen(home / "k" / "locked", passphrase="secret words")
    cert = sign(home, home / "k" / "locked", home / "k" / "locked-cert.pub")
    text = "Host *\n    IdentityFile ~/k/locked\n    IdentitiesOnly yes\n"
    assert offers(target(home, text), []) == []  # nobody types the passphrase
    found = offers(target(home, text), [key])
    assert shown(found) == [plain(key), _public(cert)]


def test_locked_key_without_pub_file_is_matched_by_its_clear_public_half(home: Path) -> None:
    key = keygen(home / "k" / "locked", passphrase="secret words")
    (home / "k" / "locked.pub").unlink()  # ssh reads the public half from the key file
    text = "Host *\n    IdentityFile ~/k/locked\n    IdentitiesOnly yes\n"
    assert offers(target(home, text), [key]) == [key]
