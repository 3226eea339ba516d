"""The preflight probe scripts run on this machine with its own python and torch (seconds
each, as the probe imports torch): the check's probe (tests/unit/check/test_check.py renders it)
and both probes finding the interface with iproute2's `ip` hidden from PATH
(orchestrator/agent/programs/route.py; its pure parts in tests/unit/agent/test_route.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.nodes.probe import parse_probe_output
from orchestrator.plan.scripts import render_template
from tests.unit.check.test_check import render_probe


@pytest.mark.slow
def test_probe_script_runs_here() -> None:
    done = subprocess.run(
        ["bash", "-c", render_probe()], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    from orchestrator.nodes.probe import parse_probe_output

    values = parse_probe_output(done.stdout)
    assert values["python_version"] == sys.version.split()[0]
    assert values["torch_version"]  # this environment has torch
    assert values["ifname"] == "lo" and values["ifname_addr"] == "127.0.0.1"
    assert int(values["disk_free_kb"]) > 0
    assert values["port_free"] == "yes" and int(values["port"]) > 0


def path_without_ip(tmp_path: Path) -> str:
    """A PATH with every command of this one except iproute2's `ip`."""
    shadow = tmp_path / "bin"
    shadow.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            target = Path(directory) / name
            if name != "ip" and not (shadow / name).exists() and os.access(target, os.X_OK):
                (shadow / name).symlink_to(target)
    assert shutil.which("ip", path=str(shadow)) is None
    return str(shadow)


@pytest.mark.slow
@pytest.mark.parametrize("template", ["check_probe.sh.j2", "probe.sh.j2"])
def test_probes_find_the_interface_without_ip(tmp_path: Path, template: str) -> None:
    context: dict[str, object] = {
        "host": "node0", "python": sys.executable, "master_addr": "127.0.0.1", "ifname": None,
        "is_master": True, "port": None, "default_port": 29500, "check_port": False,
        "bind_cores": False,
    }  # fmt: skip
    env = dict(os.environ, PATH=path_without_ip(tmp_path))
    done = subprocess.run(["bash", "-c", render_template(template, **context)],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    values = parse_probe_output(done.stdout)
    assert values["ifname"] == "lo", done.stdout
    if template == "check_probe.sh.j2":
        assert values["ifname_addr"] == "127.0.0.1", done.stdout
    else:
        assert values["route_source"] == "127.0.0.1", done.stdout
