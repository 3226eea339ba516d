"""Container options through the real command line, as a process of its own: an option
without its image is exit 2 in one line (the rest of the containers' tests are
tests/unit/plan/test_container.py)."""

from __future__ import annotations

from pathlib import Path

from tests.cli_helpers import run_cli


def test_options_without_an_image_are_exit_2_on_the_command_line(tmp_path: Path) -> None:
    (tmp_path / "hosts.txt").write_text("node1\n")
    done = run_cli(
        ["render", "hosts.txt", "-o", "out", "--container-workdir", "/w", "--", "t.py"],
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--container-workdir given without --container IMAGE" in done.stderr
    assert "Traceback" not in done.stderr
