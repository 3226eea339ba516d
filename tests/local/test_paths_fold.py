"""The path check folded into the preflight probe (orchestrator/nodes/paths/in_probe.py): the
rendered probe scripts themselves, run here as three 'nodes' on loopback."""

from __future__ import annotations

import socket
import subprocess
import sys

from orchestrator.nodes.paths.found import PathNode, failure_lines, matrix
from orchestrator.nodes.paths.in_probe import AUTO_PORTS, Fold
from orchestrator.nodes.probe import parse_probe_output, probe_script


def run_probes(
    fold: Fold, port: int | None, n: int = 3, bytecode: str | None = None
) -> dict[int, dict[str, str]]:
    """Every node's probe at once, its lines kept in fold.outputs as probe_nodes keeps them."""
    procs = {}
    for i in range(n):
        script = probe_script(
            f"n{i}", sys.executable, "127.0.0.1", check_port=i == 0, port=port, ifname=None,
            reach=fold.args(i, "127.0.0.1"), reach_source=fold.source(),
            reach_bytecode=fold.bytecode() if bytecode is None else bytecode,
            auto_port=fold.port if fold.auto else None,
        )  # fmt: skip
        procs[i] = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, text=True)
    for i, proc in procs.items():
        fold.outputs[i] = parse_probe_output(proc.communicate(timeout=60)[0])
    return fold.outputs


def group(n: int = 3) -> list[PathNode]:
    return [PathNode(i, f"n{i}", sys.executable, "127.0.0.1", "lo") for i in range(n)]


def test_one_interpreter_gives_the_facts_and_proves_every_path() -> None:
    fold = Fold.for_launch(3, None)
    assert fold.auto and AUTO_PORTS[0] <= fold.port <= AUTO_PORTS[1]
    outputs = run_probes(fold, None)
    assert outputs[0]["free_port"] == str(fold.port)  # auto takes the drawn port when free
    assert all(o["torch_version"] and o["python_version"] for o in outputs.values())
    assert all(o["route_source"] == "127.0.0.1" for o in outputs.values())
    assert outputs[0]["heard"] == "0,1,2" and outputs[2]["peers_heard"] == "0,1"
    assert fold.usable(group(), fold.port)
    report = fold.report(group(), "127.0.0.1")
    assert report.ok, failure_lines(report)
    assert report.tested() == 9
    rows = matrix(report).splitlines()[1:4]
    assert all("X" not in row and "-" not in row for row in rows), rows


def test_an_auto_port_that_is_taken_leaves_the_check_to_a_round_of_its_own() -> None:
    while True:  # a drawn port that something here holds already is as good
        fold = Fold.for_launch(2, None)
        try:
            taken = socket.create_server(("", fold.port))
        except OSError:
            continue
        break
    with taken:
        outputs = run_probes(fold, None, n=2)
    free = int(outputs[0]["free_port"])
    assert free != fold.port  # the master's kernel picked another
    assert outputs[0].get("listen_error", "").startswith("EADDRINUSE")
    assert not fold.usable(group(2), free) and not fold.usable(group(2), fold.port)


def test_a_given_port_and_what_the_fold_does_not_cover() -> None:
    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    fold = Fold.for_launch(2, port)
    assert not fold.auto and fold.port == port
    outputs = run_probes(fold, port, n=2, bytecode="00000000:AAAA")  # another interpreter's
    assert "path_check_error" not in outputs[0], outputs[0]  # compiled from the source
    assert outputs[0]["port_free"] == "yes" and outputs[0]["listen"] == "ok"
    assert fold.usable(group(2), port)
    assert not fold.usable(group(2), port + 1)  # the plan's port is another
    assert not fold.usable(group(2)[::-1], port)  # not the nodes it ran on, in order
    del fold.outputs[1]["reach"]  # a node that did not run it
    assert not fold.usable(group(2), port)
