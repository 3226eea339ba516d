"""The nodes but node 0 start torchrun once node 0's store answers (orchestrator_torchrun in
the node scripts and job.sbatch): torchrun's own client would retry a refused connection
after pauses growing up to a minute.

torch's torchrun is replaced by a stand-in package here (the boundary: what is tested is the
wait before it and the arguments handed to it); the real torchrun runs through the same
lines in every multi-node launch of the cluster tests.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.plan.scripts import render_template
from tests.factories import free_port

BASH = shutil.which("bash") or "/bin/bash"

STAND_IN = """\
import json, os, sys, time
def main():
    with open(os.environ["STAND_IN_OUT"], "w") as out:
        json.dump({"at": time.time(), "argv": sys.argv}, out)
"""


def wrapper_code() -> str:
    """The Python in orchestrator_torchrun, as bash hands it to the interpreter."""
    script = render_template("_torchrun_when_store_answers.sh.j2")
    done = subprocess.run(
        [BASH, "-c", script + '\nprintf %s "$orchestrator_torchrun"'],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def stand_in_torch(root: Path) -> Path:
    package = root / "torch" / "distributed"
    package.mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "run.py").write_text(STAND_IN)
    return root


def test_torchrun_starts_once_the_store_answers_with_its_arguments(tmp_path) -> None:
    port = free_port()
    out = tmp_path / "torchrun.json"
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(stand_in_torch(tmp_path / "lib")),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "STAND_IN_OUT": str(out),
    }
    argv = ["--nnodes=2", "--node_rank=1", "a b", "--no-python", "bash"]
    node = subprocess.Popen([sys.executable, "-c", wrapper_code(), *argv], env=env)
    try:
        time.sleep(1.5)  # six tries at the closed port
        assert node.poll() is None and not out.exists(), "torchrun ran before the store answered"
        with socket.create_server(("127.0.0.1", port)):
            opened = time.time()
            assert node.wait(timeout=30) == 0
        started = json.loads(out.read_text())
    finally:
        node.kill()
        node.wait()
    assert started["argv"] == ["torchrun", *argv]
    assert started["at"] - opened < 1.0  # a quarter second between tries, not a minute
