"""Launch a job: connect -> probe -> plan -> render -> run record -> start agents -> supervise.

The one place where the steps of the data flow meet; each step is a call into its module.
"""

from __future__ import annotations

import os
import queue
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import BinaryIO

from orchestrator.attempts.next_attempt import Next
from orchestrator.backends import close_all, connect_cluster, connect_each
from orchestrator.backends.base import NodeConnection
from orchestrator.backends.sessions import Event, NodeSession, start_sessions
from orchestrator.console.progress import Progress
from orchestrator.errors import Interrupted, OrchestratorError
from orchestrator.hosts.hostfile import Cluster
from orchestrator.plan.launch_plan import LaunchPlan, make_plan
from orchestrator.plan.scripts import (
    command_line,
    dry_run_text,
    render_node_scripts,
    write_rendered,
)
from orchestrator.plan.spec import JobSpec
from orchestrator.record.runs import RunRecord, controller_log, ended_status, new_status, now_iso
from orchestrator.record.states import NodePhase, RunState
from orchestrator.start import joining
from orchestrator.start.attempt import (
    agent_starts,
    console_sink,
    nodes_started,
    plan_states,
    record_the_end,
    secrets_of,
)
from orchestrator.start.detach import run_detached
from orchestrator.start.pool import NodePool
from orchestrator.start.preflight import check_script_exists, preflight_probe, prepare
from orchestrator.start.regrow import Regrow
from orchestrator.start.settings import LaunchOptions
from orchestrator.start.sync import sync_code
from orchestrator.supervise import Outcome, Supervisor, signals_to
from orchestrator.supervise.time_limit import Cause, WarningClock


def run_plan(
    plan: LaunchPlan,
    scripts: dict[str, str],
    spec: JobSpec,
    options: LaunchOptions,
    connections: Sequence[NodeConnection],
    record: RunRecord,
    console: BinaryIO | None,
    on_started: Callable[[], None] = lambda: None,
    pool: NodePool | None = None,
    progress: Progress | None = None,
    regrow: Regrow | None = None,
) -> Outcome:
    """Start every node's agent with its script and supervise the run to its end.

    `on_started` is called once every node's script is running. With a `pool` (--spares),
    an attempt that a node fault ends is not the end: the caller relaunches on a spare.
    With `regrow` (--min-nodes), the hosts the run does not run on are asked meanwhile.
    """
    secrets = secrets_of(spec, plan)
    states = plan_states(plan)
    nodes, ranks = states.nodes, states.ranks
    sink = console_sink(record.logs_dir, states, console, secrets.mask, options.console)
    backend = "local" if plan.is_local else "ssh"
    base = new_status(
        plan.run_id,
        backend,
        command_line(options.argv, plan.secret_names),
        plan.program.describe(),
        plan.nnodes,
        plan.world_size,
        f"{plan.master_addr}:{plan.master_port}",
    )
    if pool is not None:
        base["started_at"] = now_iso(pool.started_wall)

    def recovery_status() -> dict:
        return pool.status() if pool is not None else {}

    events: queue.Queue[Event] = queue.Queue(maxsize=4096)
    sessions: list[NodeSession] = []

    started_nodes = False

    def on_change(sup: Supervisor) -> None:
        nonlocal started_nodes
        state = RunState.STOPPING if sup.stopping else RunState.RUNNING
        record.write_status({**base, "state": state, **sup.status(), **recovery_status()})
        if started_nodes:
            return
        if progress is not None:
            progress.count(*nodes_started(sup.nodes))
        if all(n.state != NodePhase.STARTING for n in sup.nodes):
            started_nodes = True
            if progress is not None:
                progress.end()
            on_started()

    if plan.attempt > 1 and pool is not None:
        sink.note(f"attempt {plan.attempt}: {pool.world[-1].why}")
    sink.note(
        f"run {plan.run_id}: {plan.world_size} rank(s) on {plan.nnodes} node(s), "
        f"master {plan.master_addr}:{plan.master_port}; logs in {record.logs_dir}"
    )
    if options.deadline.limit_s is not None:
        sink.note(options.deadline.describe())
    limit_from = pool.started_wall if pool is not None else time.time()  # the run's start
    supervisor = Supervisor(
        nodes,
        ranks,
        sessions,
        events,
        sink,
        options.supervision,
        deadline=WarningClock.of(options.deadline, limit_from),
        max_restarts=plan.max_restarts,
        on_change=on_change,
        metrics_path=record.metrics_path,
        probes=pool.new_probes() if pool is not None else None,
        record_dir=record.path,
        lose_one=pool.lose_one if pool is not None and pool.may_swap else None,
    )
    started = time.monotonic()
    record.write_status({**base, **recovery_status()})
    try:
        with signals_to(supervisor):
            starts = agent_starts(plan, scripts, connections, secrets, options.supervision)
            if progress is not None:
                progress.begin("starting", plan.nnodes)
            supervisor.start_beating()
            if regrow is not None:
                regrow.watch(supervisor)
            try:
                start_sessions(starts, events, into=sessions)
            except OrchestratorError as exc:  # the started nodes were stopped
                record.write_status(
                    {
                        **base,
                        **supervisor.status(),
                        **recovery_status(),
                        **ended_status(RunState.FAILED, exc.exit_code, str(exc)),
                    }
                )
                raise
            outcome = supervisor.run()
    finally:
        supervisor.ended.set()  # no heartbeats after a start that failed either
        for session in sessions:
            session.close()
        if progress is not None:
            progress.end()
    if regrow is not None:
        regrow.settle()  # what the asking found joins the pool
    elapsed = time.monotonic() - (pool.started if pool is not None else started)
    # What follows, decided once for every backend (attempts/next_attempt.py).
    step, slow = Next.END, None
    if pool is not None:
        at_checkpoint = stopped_at_checkpoint(outcome, supervisor)
        slow = supervisor.swap_due if at_checkpoint else None
        if slow is not None:  # taken out as a node fault is (supervise/straggler_swap.py)
            outcome = replace(outcome, node_fault=slow)
        step = pool.after(outcome.node_fault, len(pool.back) if at_checkpoint else 0)
    if slow is not None and step.goes_on:
        outcome = replace(outcome, state=RunState.RECOVERING)
        sink.note(
            f"attempt {plan.attempt} stopped at its checkpoint after {elapsed:.1f} s to take "
            f"out slow {slow.host}: {pool.going_on()}"
        )
    elif step is Next.GROW:
        outcome = replace(outcome, state=RunState.RECOVERING)
        sink.note(
            f"attempt {plan.attempt} stopped at its checkpoint after {elapsed:.1f} s: the job "
            f"starts again on {len(pool.active) + len(pool.back)} nodes"
        )
    elif step.goes_on:  # a spare in, or the nodes left go on
        outcome = replace(outcome, state=RunState.RECOVERING)
        sink.note(outcome.summary)
        sink.note(
            f"attempt {plan.attempt} ended by a node fault after {elapsed:.1f} s: {pool.going_on()}"
        )
    else:
        if pool is not None:
            outcome = pool.amend(outcome)
        for line in outcome.closing_lines(plan.run_id, elapsed, record.logs_dir):
            sink.note(line)
    sink.close()
    record_the_end(
        plan,
        connections,
        sink,
        record,
        outcome,
        {**base, **supervisor.status(), **recovery_status()},
        ssh=options.ssh,
        keep_node_logs=options.run.keep_node_logs,
        run_dir=options.run.run_dir,
        carry=pool.carry if pool is not None else (lambda left: left),
    )
    return outcome


def stopped_at_checkpoint(outcome: Outcome, supervisor: Supervisor) -> bool:
    """Whether the attempt ended because its ranks checkpointed when asked (for nodes that
    came back, start/regrow.py, or to take out a slow one): every rank ended on the
    signal, no node fault, and the signal was not the time limit's."""
    clock = supervisor.deadline
    return (
        outcome.node_fault is None
        and outcome.state == RunState.FAILED
        and outcome.exit_code == 124
        and clock.cause is Cause.CHECKPOINT
        and clock.sent_at is not None
    )


def launch(
    cluster: Cluster,
    spec: JobSpec,
    options: LaunchOptions,
    *,
    dry_run: bool = False,
    out: BinaryIO | None = None,
) -> int:
    """The whole launch, attached to this process (its console `out`); the exit code.
    Raises OrchestratorError for bad input."""
    out = out or sys.stdout.buffer
    check_script_exists(cluster, spec)
    return _launch(cluster, spec, options, dry_run, out, out)


def start_detached(cluster: Cluster, spec: JobSpec, options: LaunchOptions) -> dict:
    """Start the run with a controller of its own (start/detach.py); return its report
    once every node runs: {"started": True}, or {"error": ..., "exit_code": n}."""
    check_script_exists(cluster, spec)
    log_path = controller_log(options.run.run_dir, options.run_id)
    return run_detached(f"{__name__}:detached", (cluster, spec, options), log_path)


def detached(cluster: Cluster, spec: JobSpec, options: LaunchOptions, report) -> int:
    """The detached controller's work (see start_detached)."""
    with open(os.devnull, "wb") as quiet:
        started = lambda: report({"started": True})  # noqa: E731
        return _launch(cluster, spec, options, False, None, quiet, on_started=started)


def _launch(
    cluster: Cluster,
    spec: JobSpec,
    options: LaunchOptions,
    dry_run: bool,
    console: BinaryIO | None,
    notes: BinaryIO,
    on_started: Callable[[], None] = lambda: None,
) -> int:
    out = notes

    def note(text: str) -> None:
        try:
            out.write(f"[orchestrator] {text}\n".encode())
            out.flush()
        except OSError:  # the terminal went away (SIGHUP): the run and its record go on
            pass

    everyone = replace(cluster, hosts=cluster.hosts + cluster.spares, spares=())
    progress = Progress.to(out)
    progress.begin("connecting", len(everyone.hosts))
    try:  # with spares (or --min-nodes), a host that cannot be reached is replaced (or left
        # out), not the end of the launch
        connections, unreachable = (
            connect_each(everyone, options.ssh, progress.tick)
            if cluster.spares or options.hosts.min_nodes is not None
            else (connect_cluster(everyone, options.ssh, progress.tick), {})
        )
    finally:
        progress.end()
    pool = NodePool(
        cluster, connections, options.run_id, options.hosts.bad_nodes, note, options.hosts.min_nodes
    )
    try:
        pool.replace_unreachable(unreachable)
        plan, scripts = prepare(pool.cluster, spec, options, pool.connections, note, pool, progress)
        if dry_run:
            if options.deadline.limit_s is not None:  # the controller's, not a script's
                out.write(f"# {options.deadline.describe()} (kept by the controller)\n".encode())
            out.write(dry_run_text(plan, scripts).encode())
            out.flush()
            return 0
        record = RunRecord.create(options.run.run_dir, options.run_id)
        asking = preflight_probe(spec, options) if options.run.preflight else None
        regrow = Regrow.of(pool, options, asking, spec.nproc_per_node)
        pool.begin(plan)
        first_start = True

        def started() -> None:
            nonlocal first_start
            pool.running()
            if first_start:
                first_start = False
                on_started()

        while True:
            write_rendered(record.path, plan, scripts)
            sync_code(plan, pool.connections, note, progress)
            outcome = run_plan(
                plan,
                scripts,
                spec,
                options,
                pool.connections,
                record,
                console,
                started,
                pool,
                progress,
                regrow,
            )
            if outcome.state != RunState.RECOVERING:
                pool.recover(outcome.node_fault, None)  # no spare: the bad-node list only
                return outcome.exit_code
            try:
                probe = preflight_probe(spec, options, progress) if options.run.preflight else None
                pool.recover(outcome.node_fault, probe)
                joining.grow(pool, probe, new_attempt=outcome.node_fault is None)
            except OrchestratorError as exc:  # no spare passed its probe, or Ctrl-C
                ended = RunState.STOPPED if isinstance(exc, Interrupted) else RunState.FAILED
                record.write_status(
                    {
                        **record.read_status(),
                        **pool.status(),
                        **ended_status(ended, exc.exit_code, f"{outcome.summary}\n{exc}"),
                    }
                )
                raise
            plan = make_plan(
                pool.cluster, spec, options.run_id, pool.facts, pool.attempt, pool.launched_with
            )
            pool.begin(plan)
            scripts = render_node_scripts(plan, command_line(options.argv, plan.secret_names))
    finally:
        close_all(pool.every_connection)
