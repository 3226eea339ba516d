"""`orchestrator check HOSTFILE`: prove a cluster is ready, in three steps.

1. Node facts, every node in parallel through the node agents (`run_on_nodes`):
   templates/check_probe.sh.j2 reports python, torch, NCCL, CUDA devices, the NCCL/gloo
   interface (the same route function the node scripts use) and its address, free disk,
   and on the master the rendezvous port (the given one, checked free, or a free one).
   The SSH round trip is timed on each open connection (keepalive requests).
2. Rendezvous reachability, again all nodes at once (orchestrator.reach): the master opens a
   temporary listener on that port, and every node connects to MASTER_ADDR:PORT from its
   chosen interface's address, retrying while the listener comes up. Two short phases,
   because with --master-port auto the others learn the port only from step 1.
3. Unless a problem above makes it pointless, a real job over every slot, launched like
   `launch` (prepare + run_plan, so it is an ordinary run record): orchestrator.collectives
   checks the exact per-rank values and times the bandwidth sweep; its report lines are
   read back from runs/<run-id>/logs/rank-N.log.
"""

from __future__ import annotations

import json
import secrets
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from importlib import resources
from typing import TextIO

from orchestrator import check
from orchestrator.backends import close_all
from orchestrator.backends.base import NodeConnection
from orchestrator.check_report import (
    CaseRow,
    Master,
    NodeReport,
    Problem,
    bandwidth_rows,
    bandwidth_table,
    choose_backend,
    collective_results,
    collectives_table,
    node_problems,
    node_table,
    problems_text,
)
from orchestrator.errors import ConfigError, NodeError, OrchestratorError
from orchestrator.execute import NodeResult, run_on_nodes
from orchestrator.hostfile import Cluster
from orchestrator.plan import is_loopback, make_plan
from orchestrator.probe import parse_probe_output
from orchestrator.render import render_template
from orchestrator.spec import DEFAULT_MASTER_PORT, JobSpec, Program, forwarded_env, merge_env

PROBE_TIME_LIMIT_S = 60.0
RTT_SAMPLES = 5
REACH_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class CheckOptions:
    run_dir: str
    run_id: str
    argv: tuple[str, ...]  # the orchestrator command line, for the run record
    python: str
    nproc_per_node: int | None = None
    master_addr: str | None = None
    master_port: int | None = None  # None: auto
    ifname: str | None = None
    backend: str = "auto"
    max_size: int | None = None  # None: check.DEFAULT_MAX_SIZE of the backend
    skip_bandwidth: bool = False
    timeout: float = 180.0
    json_path: str | None = None
    ssh: object | None = None  # orchestrator.backends.ssh.SshOptions
    forward_env: bool = True


class Interrupted(OrchestratorError):
    exit_code = 130


def run_check(cluster: Cluster, options: CheckOptions, out: TextIO | None = None) -> int:
    """The whole check; prints the report and returns 0 only when everything passed."""
    out = out or sys.stdout
    started = time.monotonic()

    def say(text: str = "") -> None:
        out.write(text + "\n")
        out.flush()

    spec = job_spec(options, port=options.master_port)
    layout = make_plan(cluster, spec, options.run_id)  # bad input (max_slots...) fails here
    slots = [node.nproc for node in layout.nodes]
    say(f"[check] {len(cluster.hosts)} node(s), {layout.world_size} rank(s) from "
        f"{cluster.path}")
    connections = connect_each(cluster, options.ssh)
    try:
        return _check(cluster, options, spec, slots, connections, started, say)
    finally:
        close_all([c for c in connections if not isinstance(c, NodeError)])


def _check(cluster: Cluster, options: CheckOptions, spec: JobSpec, slots: list[int],
           connections: list, started: float, say) -> int:
    live = [c for c in connections if not isinstance(c, NodeError)]
    rtts = ssh_rtts(live)
    first = connections[0]
    master_addr = options.master_addr or (
        first.address if not isinstance(first, NodeError) else cluster.hosts[0].name)
    pythons = [host.python or options.python for host in cluster.hosts]
    reports = []
    for index, (host, connection) in enumerate(zip(cluster.hosts, connections, strict=True)):
        error = connection.message if isinstance(connection, NodeError) else None
        reports.append(NodeReport(index, host.name, slots[index], pythons[index],
                                  local=host.is_local, ssh_error=error,
                                  ssh_rtt_ms=rtts.get(id(connection))))
    say(f"[check] probing {len(live)} node(s): python, torch, NCCL, CUDA, interface, disk")
    facts = probe_facts(cluster, options, connections, pythons, master_addr)
    reports = [replace(r, probe=facts[i][0], probe_error=facts[i][1]) if i in facts else r
               for i, r in enumerate(reports)]
    master_port = _master_port(reports[0])
    sshd_port = getattr(getattr(first, "target", None), "port", 22)
    master = Master(cluster.hosts[0].name, master_addr, master_port, sshd_port)
    backend, backend_reason = choose_backend(reports, options.backend)
    if master_port is not None and reports[0].get("port_free") == "yes":
        say(f"[check] TCP from every node to {master.endpoint} (the rendezvous)")
        reports = test_reach(reports, connections, master, options)
    else:
        reports = [replace(r, reach_skipped="no usable rendezvous port on the master")
                   for r in reports]
    problems = node_problems(reports, master, backend)
    if len(cluster.hosts) > 1 and is_loopback(master_addr):
        problems.append(Problem("cluster", f"MASTER_ADDR would be {master_addr}, a loopback "
                                "address other nodes cannot reach; list nodes by names or "
                                "addresses they can reach, or pass --master-addr"))
    say("")
    say(f"NODES (backend {backend}: {backend_reason})")
    say(node_table(reports, master, problems, backend))

    run_id, rows, bandwidth, job_code = None, [], [], 0
    if any(p.blocks_job for p in problems):
        say("")
        say("COLLECTIVES: not run; fix the problems below first")
    else:
        run_id = options.run_id
        say("")
        say(f"[check] collectives job on {sum(slots)} rank(s) ({backend}), run {run_id} in "
            f"{options.run_dir}")
        rows, bandwidth, job_problems, job_code = run_collectives(
            cluster, options, replace(spec, master_port=master_port), backend, connections)
        problems += job_problems
        say("")
        say(f"COLLECTIVES ({backend}, world size {sum(slots)})")
        say(collectives_table(rows) if rows else "  no results")
        if bandwidth:
            say("")
            say(f"BANDWIDTH ({backend}, {sum(slots)} ranks; time = mean of the timed "
                "iterations, averaged over ranks; busbw as nccl-tests)")
            say(bandwidth_table(bandwidth))
    elapsed = time.monotonic() - started
    say("")
    if problems:
        say(problems_text(problems))
        say(f"RESULT: FAILED ({len(problems)} problem(s)) in {elapsed:.1f} s")
    else:
        say(f"RESULT: passed ({len(reports)} node(s), {sum(slots)} rank(s), {backend}) in "
            f"{elapsed:.1f} s")
    if options.json_path:
        write_json(options.json_path, {
            "ok": not problems, "elapsed_s": round(elapsed, 3), "hostfile": cluster.path,
            "run_id": run_id, "run_dir": options.run_dir, "backend": backend,
            "backend_reason": backend_reason,
            "master": {"host": master.host, "addr": master.addr, "port": master.port},
            "nodes": [r.to_dict() for r in reports],
            "collectives": [row.__dict__ for row in rows],
            "bandwidth": [row.to_dict() for row in bandwidth],
            "problems": [str(p) for p in problems],
        })
    if job_code >= 128:  # interrupted: say so with the signal's code
        return job_code
    return 0 if not problems else 1


def job_spec(options: CheckOptions, port: int | None) -> JobSpec:
    args = ["--timeout", f"{options.timeout:g}"]
    if options.max_size is not None:
        args += ["--max-size", str(options.max_size)]
    if options.skip_bandwidth:
        args.append("--skip-bandwidth")
    return JobSpec(
        program=Program("orchestrator.collectives", tuple(args), is_module=True),
        python=options.python, workdir="/", nproc_per_node=options.nproc_per_node,
        master_addr=options.master_addr, master_port=port, ifname=options.ifname,
        env=merge_env(forwarded_env() if options.forward_env else []),
    )


def _master_port(master: NodeReport) -> int | None:
    value = master.get("port")
    return int(value) if value.isdigit() else None


# --- step 0: connections ----------------------------------------------------------------


def connect_each(cluster: Cluster, ssh: object | None) -> list[NodeConnection | NodeError]:
    """A connection to every node, in parallel; a node that fails gets its NodeError."""
    from orchestrator.backends.local import LocalConnection

    if cluster.is_local:
        return [LocalConnection(host.name) for host in cluster.hosts]
    from orchestrator.backends.ssh import KnownHosts, SshOptions, connect, load_config

    options = ssh or SshOptions()
    config, known = load_config(options), KnownHosts(options)

    def one(host) -> NodeConnection | NodeError:
        try:
            return LocalConnection(host.name) if host.is_local else \
                connect(host, options, config, known)
        except NodeError as exc:
            return exc
        except Exception as exc:  # still name the host
            return NodeError(host.name, f"cannot connect: {exc!r}")

    with ThreadPoolExecutor(max_workers=min(64, len(cluster.hosts))) as pool:
        return list(pool.map(one, cluster.hosts))


def ssh_rtts(connections: Sequence[NodeConnection]) -> dict[int, float]:
    """Median of RTT_SAMPLES SSH keepalive round trips per SSH connection, in ms (by id)."""
    def one(connection) -> float | None:
        client = getattr(connection, "client", None)
        if client is None:
            return None
        transport = client.get_transport()
        samples = []
        for _ in range(RTT_SAMPLES):
            begin = time.perf_counter()
            transport.global_request("keepalive@openssh.com", wait=True)
            if not transport.is_active():
                return None
            samples.append((time.perf_counter() - begin) * 1e3)
        return statistics.median(samples)

    if not connections:
        return {}
    pool = ThreadPoolExecutor(max_workers=min(64, len(connections)))
    try:
        futures = {id(c): pool.submit(one, c) for c in connections}
        found = {}
        for key, future in futures.items():
            try:
                value = future.result(timeout=10.0)
            except Exception:  # a node too slow to answer keepalives shows no RTT
                value = None
            if value is not None:
                found[key] = value
        return found
    finally:
        pool.shutdown(wait=False)


# --- step 1: node facts -----------------------------------------------------------------


def probe_facts(cluster: Cluster, options: CheckOptions, connections: list,
                pythons: list[str], master_addr: str) -> dict[int, tuple[dict, str | None]]:
    """{node index: (key=values, error)} for every connected node."""
    argvs = {}
    for index, (host, connection) in enumerate(zip(cluster.hosts, connections, strict=True)):
        if isinstance(connection, NodeError):
            continue
        script = render_template(
            "check_probe.sh.j2", host=host.name, python=pythons[index],
            master_addr=master_addr, ifname=host.ifname or options.ifname,
            is_master=index == 0, port=options.master_port, default_port=DEFAULT_MASTER_PORT)
        argvs[index] = ["bash", "-c", script]
    results = run_each(connections, pythons, argvs, PROBE_TIME_LIMIT_S, options.run_id)
    return {index: ((parse_probe_output(r.output), None) if r.ok else
                    ({}, _failure(r, pythons[index])))
            for index, r in results.items()}


def run_each(connections: list, pythons: list[str], argvs: dict[int, list[str]],
             time_limit: float, tag: str) -> dict[int, NodeResult]:
    """run_on_nodes over the nodes in `argvs` (agents tagged with the run id); a node whose
    agent cannot even start gets a failed result instead of ending the check. Ctrl-C stops
    every node and the check."""
    results: dict[int, NodeResult] = {}
    pending = dict(argvs)
    while pending:
        order = sorted(pending)
        try:
            done = run_on_nodes([connections[i] for i in order], [pythons[i] for i in order],
                                [pending[i] for i in order], time_limit=time_limit, tag=tag)
        except NodeError as exc:
            failed = next((i for i in order if connections[i].host == exc.host), None)
            if failed is None:
                raise
            results[failed] = NodeResult(exc.host, None, "", "lost", exc.message)
            del pending[failed]
            continue
        if any(r.state == "stopped" for r in done) and not any(
                "time limit" in r.detail for r in done):
            raise Interrupted("interrupted; stopped the check on every node")
        results.update(zip(order, done, strict=True))
        break
    return results


def _failure(result: NodeResult, python: str) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    tail = f": {lines[-1]}" if lines else ""
    if result.exit_code == 127 and "not found" in tail:
        return f"python {python!r} not found; pass --python PATH or set python= in the hostfile"
    return f"{result.describe()}{tail}"


# --- step 2: rendezvous reachability ----------------------------------------------------


def reach_source() -> str:
    return resources.files("orchestrator").joinpath("reach.py").read_text(encoding="utf-8")


def test_reach(reports: list[NodeReport], connections: list, master: Master,
               options: CheckOptions) -> list[NodeReport]:
    """Every usable node connects to MASTER_ADDR:PORT while the master listens."""
    timeout = min(REACH_TIMEOUT_S, _connect_timeout(options))
    token = secrets.token_hex(8)
    source = reach_source()
    testers = [r for r in reports if r.usable and r.get("ifname_exists") != "no"
               and (r.source or not r.get("ifname"))]
    argvs = {}
    for report in testers:
        argv = [report.python, "-c", source, "--host", master.addr, "--port", str(master.port),
                "--source", report.source, "--token", token, "--node", str(report.index),
                "--timeout", f"{timeout:g}", "--sshd-port", str(master.sshd_port)]
        if report.index == 0:
            argv += ["--listen", str(len(testers))]
        argvs[report.index] = argv
    if 0 not in argvs:
        return [replace(r, reach_skipped="the master cannot run the listener") for r in reports]
    pythons = [r.python for r in reports]
    results = run_each(connections, pythons, argvs, timeout + 30.0, options.run_id)
    updated = []
    for report in reports:
        result = results.get(report.index)
        if result is None:
            updated.append(replace(report, reach_skipped="not testable (see the problems)"))
        elif not result.ok:
            updated.append(replace(report, reach={"reach": "error",
                                                  "reach_error": _failure(result, "")}))
        else:
            updated.append(replace(report, reach=parse_probe_output(result.output)))
    return updated


def _connect_timeout(options: CheckOptions) -> float:
    return float(getattr(options.ssh, "connect_timeout", REACH_TIMEOUT_S))


# --- step 3: the collectives job --------------------------------------------------------


def run_collectives(cluster: Cluster, options: CheckOptions, spec: JobSpec, backend: str,
                    connections: list) -> tuple[list[CaseRow], list[check.BandwidthRow],
                                                list[Problem], int]:
    """Launch orchestrator.collectives on every slot; read its report lines back."""
    from orchestrator.launcher import LaunchOptions, prepare, run_plan
    from orchestrator.render import write_rendered
    from orchestrator.runs import RunRecord

    args = ("--backend", backend, *spec.program.args)
    spec = replace(spec, program=replace(spec.program, args=args))
    launch_options = LaunchOptions(run_dir=options.run_dir, run_id=options.run_id,
                                   argv=options.argv, grace=5.0, color="never",
                                   preflight=True, ssh=options.ssh)
    notes: list[str] = []
    plan, scripts = prepare(cluster, spec, launch_options, connections, notes.append)
    record = RunRecord.create(options.run_dir, options.run_id)
    write_rendered(record.path, plan, scripts)
    outcome = run_plan(plan, scripts, spec, launch_options, connections, record, None)
    records = {}
    for rank in range(plan.world_size):
        path = record.logs_dir / f"rank-{rank}.log"
        text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
        records[rank] = check.parse_report_lines(text.splitlines())
    hosts = {rank: plan.node_of_rank(rank).name for rank in range(plan.world_size)}
    rows, problems = collective_results(records, plan.world_size, hosts)
    bandwidth = bandwidth_rows(records.get(0, []), plan.world_size)
    if outcome.state != "succeeded" and not problems:
        problems.append(Problem(f"run {plan.run_id}", f"the collectives job {outcome.state}: "
                                f"{outcome.summary}; its logs are in {record.logs_dir}"))
    expected = 0 if options.skip_bandwidth else 2 * len(check.sweep_sizes(
        options.max_size or check.DEFAULT_MAX_SIZE[backend]))
    if outcome.state == "succeeded" and len(bandwidth) < expected:
        problems.append(Problem(f"run {plan.run_id}", f"rank 0 reported {len(bandwidth)} of "
                                f"{expected} bandwidth results; see {record.logs_dir}"))
    return rows, bandwidth, problems, outcome.exit_code if outcome.state == "stopped" else 0


def write_json(path: str, document: dict) -> None:
    try:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=2)
            handle.write("\n")
    except OSError as exc:
        raise ConfigError(f"--json {path}: cannot write it: {exc.strerror}") from None
