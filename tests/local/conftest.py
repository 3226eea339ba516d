"""The local tier: end to end on this machine, where the one node is this machine itself."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def home_of_its_own(tmp_path_factory: pytest.TempPathFactory, monkeypatch) -> Path:
    """HOME for the test and what it starts: a local run's node keeps its copy of the run in
    ~/.orchestrator/runs, and the failed, stopped and detached runs these tests make on
    purpose would otherwise stay in the real home of whoever runs the suite."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    return home
