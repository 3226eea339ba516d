"""Run the path check through the node agents: every node runs orchestrator/agent/programs/reach.py
at once (the master also opens the store's listener), and what they said is read into a
PathReport (found.py)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from importlib import resources

from orchestrator.errors import NodeError, NodeErrors
from orchestrator.nodes.paths.found import (
    PathNode,
    PathReport,
    failure_lines,
    read_report,
)
from orchestrator.nodes.paths.pairs import Schedule
from orchestrator.nodes.probe import parse_probe_output

STORE_NODE = 0  # the master: node 0 runs the store's listener
PATH_TIMEOUT_S = 3.0  # for one connection: a SYN and two retransmits
START_SKEW_S_PER_NODE = 0.05  # the agents of many nodes start over some time: wait for it


@cache
def reach_source() -> str:
    return (
        resources.files("orchestrator.agent.programs")
        .joinpath("reach.py")
        .read_text(encoding="utf-8")
    )


def store_wait(nodes: int, timeout: float = PATH_TIMEOUT_S) -> float:
    """How long the master's store waits for every node, and a node retries a refusal: a
    node's connection, made at once or never, may start that much later than the store."""
    return timeout + START_SKEW_S_PER_NODE * nodes


def node_args(
    schedule: Schedule,
    position: int,
    master_addr: str,
    port: int,
    *,
    token: str,
    at: Sequence[int] | None = None,
    timeout: float = PATH_TIMEOUT_S,
    sshd_port: int = 22,
) -> list[str]:
    """reach.py's arguments for the node at `position` of the `schedule`'s (`at`: position
    -> node index, default the position itself), but --source and --alt, which depend on
    the node's own interfaces: every node serves its peers, node 0 (the master) also runs
    the store's listener. A pure function of its arguments: the preflight probe renders
    them before it knows the nodes' addresses (in_probe.py)."""
    n = len(schedule.peers)
    at = list(at) if at is not None else list(range(n))
    args = [
        "--host", master_addr, "--port", str(port), "--token", token, "--node", str(at[position]),
        "--timeout", f"{timeout:g}", "--wait", f"{store_wait(n, timeout):g}",
        "--sshd-port", str(sshd_port), "--serve",
        "--peers", ",".join(str(at[p]) for p in schedule.peers[position]),
        "--from", ",".join(str(at[p]) for p in schedule.sources[position]),
    ]  # fmt: skip
    if at[position] == STORE_NODE:
        args += ["--listen", str(n)]
    return args


def path_argvs(
    nodes: Sequence[PathNode],
    master_addr: str,
    port: int,
    *,
    token: str,
    timeout: float = PATH_TIMEOUT_S,
    sshd_port: int = 22,
    seed: int | str = 0,
) -> dict[int, list[str]]:
    """{node index: argv}: every node serves its peers; node 0 (the master) also runs the
    store's listener, alone when it is not among `nodes` (the check's unusable master)."""
    at = [n.index for n in nodes]  # position -> node index
    wait = store_wait(len(nodes), timeout)
    schedule = Schedule.of(len(nodes), seed)
    argvs = {}
    for position, node in enumerate(nodes):
        argv = [node.python, "-c", reach_source(), "--source", node.source]
        argv += node_args(
            schedule, position, master_addr, port, token=token, at=at, timeout=timeout,
            sshd_port=sshd_port,
        )  # fmt: skip
        if node.alternates:
            argv += ["--alt", ",".join(f"{name}={addr}" for name, addr in node.alternates)]
        argvs[node.index] = argv
    if STORE_NODE not in argvs:  # the master cannot take part: it only runs the store
        argvs[STORE_NODE] = [*argvs[nodes[0].index][:3], "--host", master_addr, "--port",
                             str(port), "--token", token, "--node", str(STORE_NODE), "--timeout",
                             f"{timeout:g}", "--wait", f"{wait:g}", "--no-connect", "--serve",
                             "--listen", str(len(nodes))]  # fmt: skip
    return argvs


Runner = Callable[[dict[int, list[str]], float], Mapping[int, tuple[str | None, str]]]


def prove_paths(
    nodes: Sequence[PathNode],
    master_addr: str,
    port: int,
    run: Runner,
    *,
    timeout: float = PATH_TIMEOUT_S,
    sshd_port: int = 22,
) -> PathReport:
    """Run the check with `run(argvs, time limit)` -> {node index: (output, error or None)}
    (through the node agents); a node whose script could not run is a NodeError."""
    token = secrets.token_hex(8)
    argvs = path_argvs(
        nodes, master_addr, port, token=token, timeout=timeout, sshd_port=sshd_port, seed=token
    )
    limit = store_wait(len(nodes), timeout) + 3 * timeout + 30.0
    results = run(argvs, limit)
    outputs, errors = {}, []
    for node in nodes:
        output, error = results.get(node.index, ("", "did not run"))
        if error is not None:
            errors.append(NodeError(node.host, f"the path check did not run: {error}"))
        else:
            outputs[node.index] = parse_probe_output(output or "")
    if errors:
        raise NodeErrors(errors, "the path check")
    master = outputs.get(nodes[0].index, {})
    if master.get("listen_error"):
        raise NodeErrors(
            [
                NodeError(
                    nodes[0].host,
                    f"cannot listen on MASTER_PORT {port} for the path check: "
                    f"{master['listen_error']}; pick another --master-port",
                    exit_code=2,
                )
            ],
            "the path check",
        )
    return read_report(nodes, outputs, master_addr, port)


def raise_failures(report: PathReport) -> None:
    """Exit 2, one line per path that does not connect (naming both nodes)."""
    if report.ok:
        return
    errors = [NodeError(host, line, exit_code=2) for host, line in failure_lines(report)]
    raise NodeErrors(errors, "the path check (skip it with --no-path-check)")
