"""Plain-text views of run records for `status` and `runs`."""

from __future__ import annotations

from orchestrator.api.shown import run_status


def shown_state(status: dict) -> str:
    """The state a reader sees (record/states.py's one rule: `lost` where an SSH or local
    run's controller is gone before its end), or the record's own word for one unknown."""
    state = run_status(status).state
    return str(state) if state is not None else str(status.get("state", "?"))


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _code(value: object) -> str:
    return "-" if value is None else str(value)


def status_text(status: dict) -> str:
    lines = [
        f"run {status.get('run_id')}: {shown_state(status)}"
        + (f" (exit code {status['exit_code']})" if status.get("exit_code") is not None else ""),
        f"  backend {status.get('backend')}, {status.get('nnodes')} node(s), "
        f"{status.get('world_size')} rank(s), master {status.get('master')}",
        f"  program {status.get('program')}",
    ]
    if status.get("slurm_job_id") is not None:
        lines.append(
            f"  slurm job {status['slurm_job_id']}: {status.get('slurm_state') or '?'}"
            + (f", restart {status['slurm_restarts']}" if status.get("slurm_restarts") else "")
            + (f", via {status['slurm_login']}" if status.get("slurm_login") else "")
        )
    if status.get("node_files"):  # SLURM without a shared file system (--job-dir)
        lines.append(f"  the nodes' files: {status['node_files']} on each node")
    lines += [
        f"  started {status.get('started_at')}"
        + (f", ended {status['ended_at']}" if status.get("ended_at") else ""),
    ]
    if status.get("time_limit_s"):  # --time over SSH
        warning = status.get("warning")
        lines.append(
            f"  time limit {status['time_limit_s']} s"
            + (
                f"; SIG{warning['signal']} to {warning['ranks_signalled']} rank(s) at "
                f"{warning['sent_at']}, {warning['before_limit_s']} s before it"
                if warning
                else ""
            )
        )
    if status.get("stop_reason"):
        lines.append(f"  stop: {status['stop_reason']}")
    if status.get("restarts"):  # torchrun --max-restarts
        lines.append(f"  restarts: {status['restarts']}")
        if not status.get("summary"):  # which names them when the run has ended
            lines += [f"    {cause}" for cause in status.get("restart_causes") or []]
    if status.get("recoveries"):  # --spares
        from orchestrator.api.shown import describe_recovery

        spares = ", ".join(status.get("spares") or []) or "none"
        lines.append(f"  recoveries: {len(status['recoveries'])} (spares left: {spares})")
        if not status.get("summary"):  # which names them when the run has ended
            lines += [f"    {describe_recovery(entry)}" for entry in status["recoveries"]]
    world = status.get("world") or []
    if len({len(entry["nodes"]) for entry in world}) > 1:  # --min-nodes: the world changed
        from orchestrator.api.shown import describe_world

        sizes = " -> ".join(str(len(entry["nodes"])) for entry in world)
        lines.append(f"  world: {sizes} node(s)")
        lines += [f"    {describe_world(entry)}" for entry in world]
    from orchestrator.api.shown import job_attempts

    attempts = job_attempts(status)  # SLURM's jobs
    if len(attempts) > 1 or attempts[:1] and attempts[0].get("warned_at"):  # time limits
        from orchestrator.api.shown import describe_job_attempt

        left = status.get("resubmits_left")
        lines.append(f"  attempts: {len(attempts)} (resubmits left: {left})")
        lines += [f"    {describe_job_attempt(entry)}" for entry in attempts]
    if isinstance(status.get("goodput"), dict):  # the run ended: where its time went
        from orchestrator.api.shown import goodput_table

        lines += goodput_table(status["goodput"])
    nodes = status.get("nodes") or []
    if nodes:
        rows = [["NODE", "HOST", "STATE", "EXIT", "DETAIL"]]
        rows += [
            [
                str(n.get("node_rank")),
                str(n.get("host")),
                str(n.get("state")),
                _code(n.get("exit_code")),
                n.get("detail") or "",
            ]
            for n in nodes
        ]
        lines += ["", _table(rows)]
    ranks = status.get("ranks") or []
    if ranks:
        rows = [["RANK", "HOST", "LOCAL", "STATE", "EXIT"]]
        rows += [
            [
                str(r.get("rank")),
                str(r.get("host")),
                str(r.get("local_rank")),
                str(r.get("state")),
                _code(r.get("exit_code")),
            ]
            for r in ranks
        ]
        lines += ["", _table(rows)]
    if status.get("summary"):
        lines += ["", status["summary"]]
    return "\n".join(lines)


def runs_table(runs: list[tuple[str, dict]], run_dir: str) -> str:
    if not runs:
        return f"no runs in {run_dir}"
    rows = [["RUN", "STATE", "BACKEND", "NODES", "RANKS", "STARTED", "EXIT"]]
    rows += [
        [
            run_id,
            shown_state(s),
            str(s.get("backend")),
            str(s.get("nnodes")),
            str(s.get("world_size")),
            str(s.get("started_at")),
            _code(s.get("exit_code")),
        ]
        for run_id, s in runs
    ]
    return _table(rows)
