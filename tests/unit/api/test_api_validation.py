"""Every launch flag's bad value is refused once, by its option group: `orchestrator.launch()`
raises the same `ConfigError` (naming the flag and the keyword) that the command line prints
with exit 2, and neither starts anything nor makes a run record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import orchestrator
from orchestrator.cli.commands import main
from orchestrator.errors import ConfigError
from orchestrator.options.declare import Flag, declared
from orchestrator.options.keywords import LaunchArgs

HOSTFILE = str(Path(__file__).resolve().parents[3] / "hostfiles" / "local.txt")


def bad_values(flag: Flag) -> list[Any]:
    """Values the field's own declaration refuses (none for a free-form one)."""
    values: list[Any] = []
    if flag.minimum is not None:
        values.append(flag.kind(flag.minimum - 1) if flag.kind is int else flag.minimum - 0.5)
    if flag.above is not None:
        values.append(flag.above)
    if flag.choices:
        values.append("nonesuch")
    if flag.nonblank:
        values.append(" ")
    return values


DECLARED = [
    (item.name, value)
    for group in LaunchArgs.groups().values()
    for item, flag in declared(group)
    for value in bad_values(flag)
]
# The cases a new user tries first, and the parsed forms the declarations cannot enumerate.
NAMED = [
    ("grace", -5),
    ("hang_timeout", -1),
    ("heartbeat_timeout", -1),
    ("master_port", "70000"),  # as the command line reads it; an int: below
    ("master_port", "abc"),
    ("stragglers", "0.5,20"),
    ("container_runtime", "kubernetes"),
    ("min_free_disk", "lots"),
    ("partition", "a b"),
    ("sbatch_args", ("mem=4G",)),
    ("time_limit", "150"),  # seconds or minutes? refused, with both ways to write it
]


def as_flag(keyword: str, value: Any) -> list[str]:
    flag = next(
        f for g in LaunchArgs.groups().values() for i, f in declared(g) if i.name == keyword
    )
    values = value if isinstance(value, tuple) else (value,)
    return [arg for item in values for arg in (flag.flag_for(keyword), str(item))]


@pytest.mark.parametrize(("keyword", "value"), NAMED + DECLARED)
def test_the_api_and_the_command_line_refuse_alike(
    keyword: str, value: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    with pytest.raises(ConfigError) as refused:
        orchestrator.launch(HOSTFILE, run_dir=str(runs), **{keyword: value})
    message = str(refused.value)
    assert f"(keyword {keyword})" in message
    assert refused.value.exit_code == 2
    with pytest.raises(SystemExit) as exited:
        main(["launch", HOSTFILE, "--run-dir", str(runs), *as_flag(keyword, value)])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"orchestrator: error: {message}\n"
    assert not runs.exists() or not any(runs.iterdir())  # no run record, nothing started


def test_every_bound_a_field_declares_is_tried() -> None:
    """The table above covers every field with a declared bound or choice."""
    bounded = {
        item.name
        for group in LaunchArgs.groups().values()
        for item, flag in declared(group)
        if bad_values(flag)
    }
    assert {"grace", "hang_timeout", "heartbeat_timeout", "container_runtime"} <= bounded
    assert bounded == {keyword for keyword, _ in DECLARED}


def test_a_port_given_as_a_number_is_refused_too(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"--master-port must be .*got 70000 \(keyword master_port\)"
    ):
        orchestrator.launch(HOSTFILE, run_dir=str(tmp_path), master_port=70000)


def test_a_group_says_which_flags_were_given_defaults_as_typed_or_not() -> None:
    from orchestrator.options.running import RunOptions
    from orchestrator.options.workload import JobOptions

    assert JobOptions().given() == [] and RunOptions().given() == []
    assert JobOptions(master_port="auto", nproc_per_node=2).given() == ["--nproc-per-node"]
    assert RunOptions(min_free_disk="2G").given() == ["--min-free-disk"]


def test_exec_refuses_a_negative_timeout_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError) as refused:
        orchestrator.exec_command(HOSTFILE, "true", timeout=-1)
    assert str(refused.value) == "--timeout must be 0 or more, got -1 (keyword timeout)"
    with pytest.raises(SystemExit) as exited:
        main(["exec", HOSTFILE, "--timeout", "-1", "--", "true"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"orchestrator: error: {refused.value}\n"
