"""DeepSpeed's short flags: `-i` is --include and `-e` --exclude (a DeepSpeed user's `-i
host:1` runs the job they mean), and --identity has no short form. A key the user named that
is not there is an error naming it (exit 2), from the command line and from Python; an ssh
config's IdentityFile that is missing is skipped as ssh skips it, and named when no key is
accepted."""

from __future__ import annotations

from pathlib import Path

import click
import paramiko
import pytest

from orchestrator.errors import ConfigError


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("short-flags")
    (directory / "h.txt").write_text("localhost slots=2\n")
    (directory / "x.py").write_text("print('x')\n")
    return directory


def dry_run_here(workdir: Path, capsys, monkeypatch, *flags: str) -> tuple[int, str, str]:
    """`orchestrator launch h.txt FLAGS --dry-run -- x.py` through the console script's entry
    point, in this process (tests/local/test_short_flags_local.py runs it as a process)."""
    from orchestrator.cli import main

    monkeypatch.chdir(workdir)
    monkeypatch.setenv("NO_COLOR", "1")
    with pytest.raises(SystemExit) as info:  # anything else escaping main is a traceback
        main(["launch", "h.txt", *flags, "--dry-run", "--run-dir", "runs", "--", "x.py"])
    out, err = capsys.readouterr()
    return info.value.code, out, err


def ranks(code: int, out: str, err: str) -> tuple[str, list[str], list[str]]:
    """The plan's world size, each node script's CUDA_VISIBLE_DEVICES and nproc."""
    assert code == 0, err
    world = next(line for line in out.splitlines() if line.startswith("world_size:"))
    devices = [line.strip() for line in out.splitlines() if "export CUDA_VISIBLE_DEVICES=" in line]
    nproc = [word for word in out.split() if word.startswith("--nproc_per_node=")]
    return world, devices, nproc


def test_dash_i_is_include_one_rank_on_slot_1(workdir: Path, capsys, monkeypatch) -> None:
    shown = ranks(*dry_run_here(workdir, capsys, monkeypatch, "-i", "localhost:1"))
    assert shown == ("world_size: 1", ["export CUDA_VISIBLE_DEVICES=1"], ["--nproc_per_node=1"])
    assert ranks(*dry_run_here(workdir, capsys, monkeypatch, "--include", "localhost:1")) == shown


def test_dash_e_is_exclude(workdir: Path, capsys, monkeypatch) -> None:
    assert ranks(*dry_run_here(workdir, capsys, monkeypatch, "-e", "localhost:1")) == (
        "world_size: 1",
        ["export CUDA_VISIBLE_DEVICES=0"],
        ["--nproc_per_node=1"],
    )


def test_a_missing_identity_file_exits_2_naming_it(workdir: Path, capsys, monkeypatch) -> None:
    code, out, err = dry_run_here(workdir, capsys, monkeypatch, "--identity", "nosuchkey")
    assert code == 2, out + err
    assert "Traceback" not in out + err
    assert err.startswith("orchestrator: error: --identity 'nosuchkey': no such file")
    assert str(workdir / "nosuchkey") in err
    assert not (workdir / "runs").exists()


@pytest.mark.parametrize("command", ["check", "exec", "clean"])
def test_every_command_with_identity_refuses_a_missing_one(
    workdir: Path, capsys, monkeypatch, command: str
) -> None:
    from orchestrator.cli import main

    monkeypatch.chdir(workdir)
    tail = ["--", "true"] if command == "exec" else []
    with pytest.raises(SystemExit) as info:
        main([command, "h.txt", "--identity", "nosuchkey", *tail])
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert "--identity 'nosuchkey': no such file" in err and "Traceback" not in err


def test_no_command_takes_dash_i_for_a_key() -> None:
    """Every command's -i and -e are DeepSpeed's selection flags, or none at all."""
    from orchestrator.cli.commands import cli

    def commands(group: click.Group, prefix: str = ""):
        for name, command in group.commands.items():
            if isinstance(command, click.Group):
                yield from commands(command, f"{prefix}{name} ")
            else:
                yield f"{prefix}{name}", command

    found = {}
    for name, command in commands(cli):
        for param in command.params:
            for short in ("-i", "-e"):
                if short in param.opts:
                    found[(name, short)] = param.name
            if param.name == "identity_files":
                assert param.opts == ["--identity"], (name, param.opts)
    assert found == {
        (name, short): keyword
        for name in ("launch", "render", "check")
        for short, keyword in (("-i", "include"), ("-e", "exclude"))
    }


def test_the_keyword_api_refuses_a_missing_key_and_takes_one_that_is_there(
    tmp_path, monkeypatch
) -> None:
    from orchestrator.options.keywords import LaunchArgs
    from orchestrator.options.reaching import SshOptions

    with pytest.raises(
        ConfigError, match=r"^--identity 'nosuchkey': no such file .*identity_files"
    ):
        LaunchArgs.of({"identity_files": ("nosuchkey",)})
    with pytest.raises(ConfigError, match="is not a file"):
        SshOptions(identity_files=(str(tmp_path),))
    key = tmp_path / "id_test"
    key.write_text("a key\n")
    monkeypatch.chdir(tmp_path)  # kept absolute: a detached controller runs elsewhere
    assert SshOptions(identity_files=("id_test",)).identity_files == (str(key),)


def test_a_missing_ssh_config_identity_file_is_skipped_then_named(tmp_path, monkeypatch) -> None:
    """As ssh does, a config's IdentityFile that is not there is no error by itself; when
    no key is accepted, the error names it (a typo is then the likely cause)."""
    from orchestrator.backends.ssh.client_config import SshConfig, resolve
    from orchestrator.backends.ssh.connect import _authentication_failed
    from orchestrator.backends.ssh.identities import offers
    from orchestrator.options.reaching import SshOptions

    monkeypatch.setenv("HOME", str(tmp_path))
    config = tmp_path / "config"
    config.write_text("Host node1\n    IdentityFile ~/.ssh/id_typo\n    IdentitiesOnly yes\n")
    target = resolve("node1", SshConfig(str(config)), SshOptions())
    assert offers(target, []) == []
    error = _authentication_failed("node1", target, "node1:22", paramiko.AuthenticationException())
    assert f"IdentityFile {tmp_path}/.ssh/id_typo does not exist" in error.message
