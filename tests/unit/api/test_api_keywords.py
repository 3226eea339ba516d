"""The API's keywords and the command line's flags are one set with one set of defaults;
bad keywords and bad input are refused with what and where. That the package names its
API without importing it is seen from fresh interpreters in
tests/local/test_api_keywords_local.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.api.request import build
from orchestrator.cli.jobs import launch as launch_command
from orchestrator.errors import ConfigError
from orchestrator.options.declare import declared
from orchestrator.options.keywords import LaunchArgs

CALL_MODES = {"hostfile", "program", "dry_run", "detach"}  # how launch is called, not a keyword


def test_every_launch_flag_is_a_keyword_with_the_same_default() -> None:
    context = launch_command.make_context("launch", ["hosts.txt"])
    flags = {name: value for name, value in context.params.items() if name not in CALL_MODES}
    groups = LaunchArgs.groups().values()
    assert set(flags) == {item.name for group in groups for item, _ in declared(group)}
    assert LaunchArgs.of(flags) == LaunchArgs()  # the flags' defaults, once read, are the API's


def test_a_keyword_that_is_no_flag_is_refused_with_the_ones_there_are() -> None:
    with pytest.raises(ConfigError, match=r"no keyword 'num_gpu'; .*num_gpus"):
        LaunchArgs.of({"num_gpu": 2})
    assert LaunchArgs.of({"env": ["A=1"]}).job.env == ("A=1",)  # a list where a tuple is kept


def test_bad_input_says_where(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("node1 slots=2\nnode2 slots=two\n")
    with pytest.raises(ConfigError, match=rf"{hosts}:2"):
        build(str(hosts), (), LaunchArgs(), ("test",), print)
    with pytest.raises(ConfigError, match="HOSTFILE is missing"):
        build(None, (), LaunchArgs(), ("test",), print)
    with pytest.raises(ConfigError, match="backend 'k8s'"):
        build(str(hosts), (), LaunchArgs.of({"backend": "k8s"}), ("test",), print)
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    hosts.write_text("localhost slots=1\n")
    taken = LaunchArgs.of({"run_dir": str(tmp_path / "runs"), "run_id": "taken"})
    with pytest.raises(ConfigError, match="run 'taken' already exists"):
        build(str(hosts), (), taken, ("test",), print)
