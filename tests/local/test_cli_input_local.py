"""Bad input through the real command line, as a user meets it, in processes of its own:
the cases of tests/unit/cli/test_cli_input.py's BAD and GOOD tables run as `python -m
orchestrator ...`, all in parallel once per module (they are independent), and the console
script and `--help` as a user starts them. Each bad case must exit 2 with a message naming
the file:line or the flag, and never print a traceback (check_refused); the cases that call
`orchestrator.cli.main` in the test's own process stay in the unit tier."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from tests.unit.cli.test_cli_input import BAD, GOOD, MORE_BAD, Case, check_refused, prepare_inputs

CLI = [sys.executable, "-m", "orchestrator"]
CONSOLE_SCRIPT = Path(sys.executable).with_name("orchestrator")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("cli")
    prepare_inputs(directory)
    return directory


@pytest.fixture(scope="module")
def results(workdir: Path) -> dict[str, subprocess.CompletedProcess]:
    env = {**os.environ, "NO_COLOR": "1"}

    def run(case: Case) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*CLI, *case.argv], cwd=workdir, env=env, capture_output=True, text=True, timeout=120
        )

    cases = {**BAD, **GOOD}
    assert not set(BAD) & set(MORE_BAD)
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = {name: pool.submit(run, case) for name, case in cases.items()}
    return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_exits_2_with_a_clear_message(results, workdir: Path, name: str) -> None:
    result = results[name]
    check_refused(BAD[name], result.returncode, result.stdout, result.stderr, workdir)


def test_dry_run_prints_the_plan_and_starts_nothing(results, workdir: Path) -> None:
    result = results["dry run"]
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert (
        "\n# time limit 14400 s; SIGUSR1 to every rank 120 s before (kept by the controller)\n"
        "# plan.yaml\n" in result.stdout
    )
    plan_text, _, script = result.stdout.partition("# ---- node0.sh (runs on localhost) ----\n")
    plan = yaml.safe_load(plan_text.split("# plan.yaml\n", 1)[1])
    assert plan["run_id"] == "dry1" and plan["world_size"] == 2
    assert plan["program"] == "-m mypkg.train"
    assert script.startswith("#!/usr/bin/env bash\n")
    assert "--nnodes=1 --node_rank=0 --nproc_per_node=2" in script
    syntax = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    assert syntax.returncode == 0, syntax.stderr
    assert not (workdir / "runs").exists()  # --dry-run writes no run record


def test_render_writes_plan_and_one_executable_script_per_node(results, workdir: Path) -> None:
    for name, folder, count in (
        ("render one node", "out-local", 1),
        ("render two nodes", "out dir", 2),
    ):
        result = results[name]
        assert result.returncode == 0, result.stderr
        out = workdir / folder
        expected = ["plan.yaml"] + [f"node{i}.sh" for i in range(count)]
        assert sorted(p.name for p in out.iterdir()) == sorted(expected)
        assert result.stdout.splitlines() == [str(Path(folder) / n) for n in expected]
        plan = yaml.safe_load((out / "plan.yaml").read_text())
        assert plan["nnodes"] == count
        for index in range(count):
            script = out / f"node{index}.sh"
            assert script.stat().st_mode & stat.S_IXUSR
            text = script.read_text()
            assert f"--node_rank={index}" in text
            syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
            assert syntax.returncode == 0, syntax.stderr


def test_render_keeps_secrets_out_and_quotes_values(results, workdir: Path) -> None:
    assert results["render two nodes"].returncode == 0
    out = workdir / "out dir"
    for path in out.iterdir():
        assert "tok-hidden-42" not in path.read_text(), path
    node1 = (out / "node1.sh").read_text()
    assert "export MSG='a b $c'" in node1 and "cd '/srv/my project'" in node1
    assert "API_TOKEN=***" in node1.splitlines()[1]
    assert yaml.safe_load((out / "plan.yaml").read_text())["secrets"] == ["API_TOKEN"]


def test_console_script_reports_errors_the_same_way(workdir: Path) -> None:
    if not CONSOLE_SCRIPT.exists():
        pytest.skip(f"no console script next to {sys.executable}")
    result = subprocess.run(
        [str(CONSOLE_SCRIPT), "launch", "empty.txt", "--dry-run"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "empty.txt: no hosts" in result.stderr


@pytest.mark.parametrize("argv", [["--help"], ["launch", "--help"]])
def test_help_does_not_import_torch(argv: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "orchestrator", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and "Usage:" in result.stdout
    imported = [
        line.rsplit("|", 1)[-1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    ]
    assert "click" in imported  # the check sees real imports
    torch_modules = [m for m in imported if m == "torch" or m.startswith("torch.")]
    assert torch_modules == []
