"""The package names its API without importing it, seen from a fresh python interpreter
each (the imports a test's own process has made already would hide it); the API's keywords
and flags are tests/unit/api/test_api_keywords.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import orchestrator


def test_no_part_of_the_package_shadows_a_name_of_its_api() -> None:
    """A subpackage or module `orchestrator.X` becomes the package's attribute X once
    imported, hiding an API name X (as the stage folder `launch/` once hid `launch()`)."""
    package = Path(orchestrator.__file__).parent
    api = [name for name in orchestrator.__all__ if not name.startswith("__")]
    clashes = [n for n in api if (package / n).is_dir() or (package / f"{n}.py").exists()]
    assert not clashes
    probe = "import orchestrator.start.launcher, orchestrator; print(callable(orchestrator.launch))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.stdout.strip() == "True", done.stderr


def test_the_package_names_its_api_without_importing_it() -> None:
    probe = (
        "import sys, orchestrator; before = 'orchestrator.api.launching' in sys.modules; "
        "f = orchestrator.launch; print(before, 'orchestrator.api.launching' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.stdout.split() == ["False", "True"], done.stderr
    assert {"launch", "attach", "Run", "RunFailed", "ConfigError"} <= set(dir(orchestrator))
    with pytest.raises(AttributeError, match="no attribute 'lunch'"):
        orchestrator.lunch  # noqa: B018
