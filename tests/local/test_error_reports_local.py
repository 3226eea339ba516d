"""Errors keep their type across a detached start, through a real detached controller (a
python interpreter of its own): the report it sends back is rebuilt by `launch()`'s caller
(api/launching.started_error) into the error raised. The rest, and the errors' own words,
are tests/unit/test_error_reports.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.api.launching import started_error
from orchestrator.start.detach import run_detached
from tests.unit.test_error_reports import ERRORS, same_error


def raise_error(name: str, report) -> int:
    """A detached controller's work that fails before any node starts."""
    raise ERRORS[name]


@pytest.mark.parametrize("name", ["nodes", "sigterm"])
def test_an_error_crosses_the_detached_controllers_pipe(name: str, tmp_path: Path) -> None:
    report = run_detached(f"{__name__}:raise_error", (name,), str(tmp_path / "controller.log"))
    same_error(started_error(report), ERRORS[name])
