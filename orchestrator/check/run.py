"""`orchestrator check HOSTFILE`: prove a cluster is ready, in three steps.

1. Node facts (orchestrator.check.gather): SSH round trip, python, torch, NCCL, CUDA devices,
   the NCCL/gloo interface, free disk, and the rendezvous port on the master.
2. The paths (orchestrator.check.gather + orchestrator.nodes.paths): can every node open a
   TCP connection to MASTER_ADDR:MASTER_PORT, and to its peers, from its chosen interface?
3. Unless a problem above makes it pointless, a real job over every slot, launched like
   `launch` (prepare + run_plan, so it is an ordinary run record that `runs` lists):
   orchestrator.check.collectives checks the exact per-rank values and times the bandwidth
   sweep; its report lines are read back from runs/<run-id>/logs/rank-N.log.

This module drives the steps. What they found is read by orchestrator.check.results and
orchestrator.check.diagnose (problems with what to fix), and the report printed after each
step (tables, optional JSON) is written by orchestrator.check.report; the input refused
before any node is contacted, by orchestrator.check.inputs.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TextIO

from orchestrator.backends import close_all, connect_each
from orchestrator.check import measure
from orchestrator.check.diagnose import node_problems, path_problems
from orchestrator.check.facts import Master, NodeReport, choose_backend
from orchestrator.check.gather import (
    REACH_TIMEOUT_S,
    probe_facts,
    reach_master,
    ssh_rtts,
)
from orchestrator.check.inputs import CheckOptions
from orchestrator.check.report import (
    job_section,
    json_document,
    nodes_section,
    paths_section,
    result_section,
)
from orchestrator.check.results import (
    JobResult,
    Problem,
    bandwidth_rows,
    collective_results,
)
from orchestrator.errors import ConfigError, NodeError
from orchestrator.hosts.hostfile import Cluster
from orchestrator.nodes.paths.found import PathReport
from orchestrator.nodes.paths.pairs import scheme
from orchestrator.plan.launch_plan import is_loopback, make_plan
from orchestrator.plan.spec import JobSpec, Program, forwarded_env, merge_env
from orchestrator.record.states import RunState


def run_check(cluster: Cluster, options: CheckOptions, out: TextIO | None = None) -> int:
    """The whole check; prints the report, returns 0 only when everything passed."""
    out = out or sys.stdout
    started = time.monotonic()

    def say(text: str = "") -> None:
        out.write(text + "\n")
        out.flush()

    spec = job_spec(options)
    layout = make_plan(cluster, spec, options.run_id)  # bad input (max_slots...) fails here
    slots = [node.nproc for node in layout.nodes]
    chosen = f" ({cluster.selection})" if cluster.selection else ""  # --include/--exclude/...
    say(
        f"[check] {len(cluster.hosts)} node(s), {layout.world_size} rank(s) from "
        f"{cluster.path}{chosen}"
    )
    reached, errors = connect_each(cluster, options.ssh)
    connections = [errors.get(index, c) for index, c in enumerate(reached)]
    try:
        return _check(cluster, options, spec, slots, connections, started, say)
    finally:
        close_all([c for c in connections if not isinstance(c, NodeError)])


def _check(
    cluster: Cluster,
    options: CheckOptions,
    spec: JobSpec,
    slots: list[int],
    connections: list,
    started: float,
    say: Callable[..., None],
) -> int:
    reports, master, paths = inspect_nodes(cluster, options, slots, connections, say)
    backend, backend_reason = choose_backend(reports, options.backend)
    problems = node_problems(reports, master, backend) + path_problems(paths)
    if len(cluster.hosts) > 1 and is_loopback(master.addr):
        problems.append(
            Problem(
                "cluster",
                f"MASTER_ADDR would be {master.addr}, a loopback "
                "address the other nodes cannot reach; list nodes by names or "
                "addresses they can reach, or pass --master-addr",
            )
        )
    say(nodes_section(reports, master, problems, backend, backend_reason))
    if paths is not None:
        say(paths_section(paths))

    world_size = sum(slots)
    job = JobResult()
    say("")
    if any(p.blocks_job for p in problems):
        say("COLLECTIVES: not run; fix the problems below first")
    else:
        say(
            f"[check] collectives job on {world_size} rank(s) ({backend}), run "
            f"{options.run_id} in {options.run_dir}"
        )
        job = run_collectives(
            cluster, options, replace(spec, master_port=master.port), backend, connections
        )
        problems += job.problems
        say(job_section(job, backend, world_size, options.run_id))
    elapsed = time.monotonic() - started
    say(result_section(job, problems, len(reports), world_size, backend, elapsed))
    if options.json_path:
        document = json_document(
            cluster,
            run_id=options.run_id,
            run_dir=options.run_dir,
            reports=reports,
            master=master,
            backend=backend,
            backend_reason=backend_reason,
            job=job,
            problems=problems,
            world_size=world_size,
            elapsed=elapsed,
        )
        write_json(options.json_path, document)
    if job.interrupted:
        return job.exit_code
    return 0 if not problems else 1


def inspect_nodes(
    cluster: Cluster,
    options: CheckOptions,
    slots: list[int],
    connections: list,
    say: Callable[..., None],
) -> tuple[list[NodeReport], Master, PathReport | None]:
    """Steps 1 and 2: every node's facts, its TCP reach to the rendezvous and its peers."""
    live = [c for c in connections if not isinstance(c, NodeError)]
    rtts = ssh_rtts(live)
    first = connections[0]
    master_addr = options.master_addr or (
        first.address if not isinstance(first, NodeError) else cluster.hosts[0].name
    )
    pythons = [host.python or options.python for host in cluster.hosts]
    inside = f", inside {options.container.describe()}" if options.container else ""
    say(f"[check] probing {len(live)} node(s): python, torch, NCCL, CUDA{inside}, interface, disk")
    facts = probe_facts(
        cluster,
        connections,
        pythons,
        master_addr,
        ifname=options.ifname,
        master_port=options.master_port,
        tag=options.run_id,
        container=options.container,
    )
    reports = []
    for index, (host, connection) in enumerate(zip(cluster.hosts, connections, strict=True)):
        probe, probe_error = facts.get(index, ({}, None))
        reports.append(
            NodeReport(
                index,
                host.name,
                slots[index],
                pythons[index],
                local=host.is_local,
                ssh_error=connection.message if isinstance(connection, NodeError) else None,
                ssh_rtt_ms=rtts.get(id(connection)),
                probe=probe,
                probe_error=probe_error,
                slot_ids=host.slot_ids,
            )
        )
    port = reports[0].get("port")
    sshd_port = getattr(getattr(first, "target", None), "port", 22)
    master = Master(
        cluster.hosts[0].name, master_addr, int(port) if port.isdigit() else None, sshd_port
    )
    if master.port is not None and reports[0].get("port_free") == "yes":
        say(
            f"[check] TCP from every node to {master.endpoint} (the rendezvous) and to its "
            f"peers: {scheme(len(reports))}"
        )
        timeout = min(
            REACH_TIMEOUT_S, float(getattr(options.ssh, "connect_timeout", None) or REACH_TIMEOUT_S)
        )
        reports, paths = reach_master(
            reports, connections, master, timeout=timeout, tag=options.run_id
        )
    else:
        paths = None
        reports = [
            replace(r, reach_skipped="no usable rendezvous port on the master") for r in reports
        ]
    return reports, master, paths


def job_spec(options: CheckOptions) -> JobSpec:
    """The collectives job as a JobSpec, as `launch -- -m orchestrator.check.collectives`."""
    args = ["--timeout", f"{options.timeout:g}"]
    if options.max_size is not None:
        args += ["--max-size", str(options.max_size)]
    if options.skip_bandwidth:
        args.append("--skip-bandwidth")
    return JobSpec(
        program=Program("orchestrator.check.collectives", tuple(args), is_module=True),
        python=options.python,
        workdir="/",
        nproc_per_node=options.nproc_per_node,
        master_addr=options.master_addr,
        master_port=options.master_port,
        ifname=options.ifname,
        env=merge_env(forwarded_env() if options.forward_env else []),
        container=options.container,
    )


def run_collectives(
    cluster: Cluster, options: CheckOptions, spec: JobSpec, backend: str, connections: list
) -> JobResult:
    """Step 3: launch orchestrator.check.collectives on every slot; read its reports back."""
    from orchestrator.options.display import ConsoleOptions
    from orchestrator.options.running import RunOptions
    from orchestrator.options.supervision import Supervision
    from orchestrator.plan.scripts import write_rendered
    from orchestrator.record.runs import RunRecord
    from orchestrator.start.launcher import run_plan
    from orchestrator.start.preflight import prepare
    from orchestrator.start.settings import LaunchOptions

    args = ("--backend", backend, *spec.program.args)
    spec = replace(spec, program=replace(spec.program, args=args))
    launch_options = LaunchOptions(
        run_id=options.run_id,
        argv=options.argv,
        run=RunOptions(run_dir=options.run_dir),
        supervision=Supervision(grace=5.0),
        console=ConsoleOptions(color="never"),
        ssh=options.ssh,
    )
    plan, scripts = prepare(cluster, spec, launch_options, connections)
    record = RunRecord.create(options.run_dir, options.run_id)
    write_rendered(record.path, plan, scripts)
    outcome = run_plan(plan, scripts, spec, launch_options, connections, record, None)
    records = {}
    for rank in range(plan.world_size):
        path = record.logs_dir / f"rank-{rank}.log"
        text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
        records[rank] = measure.parse_report_lines(text.splitlines())
    hosts = {rank: plan.node_of_rank(rank).name for rank in range(plan.world_size)}
    rows, problems = collective_results(records, plan.world_size, hosts)
    bandwidth = bandwidth_rows(records.get(0, []), plan.world_size)
    job = JobResult(outcome.state, outcome.exit_code, rows, bandwidth, problems)
    where = f"run {plan.run_id}"
    if job.interrupted:
        job.problems = [Problem(where, f"interrupted; its logs are in {record.logs_dir}")]
    elif outcome.state != RunState.SUCCEEDED and not problems:
        problems.append(
            Problem(
                where,
                f"the collectives job {outcome.state}: "
                f"{outcome.summary}\n    its logs are in {record.logs_dir}",
            )
        )
    elif outcome.state == RunState.SUCCEEDED and not options.skip_bandwidth:
        expected = 2 * len(
            measure.sweep_sizes(options.max_size or measure.DEFAULT_MAX_SIZE[backend])
        )
        if len(bandwidth) < expected:
            problems.append(
                Problem(
                    where,
                    f"rank 0 reported {len(bandwidth)} of {expected} "
                    f"bandwidth results; see {record.logs_dir}",
                )
            )
    return job


def write_json(path: str, document: dict) -> None:
    try:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=2)
            handle.write("\n")
    except OSError as exc:
        raise ConfigError(f"--json {path}: cannot write it: {exc.strerror}") from None
