"""Launching, as a Python program and the command line both do it: `launch`, `render`, `exec`
(`exec_command` over SSH, `exec_on_run` on a running SLURM run's nodes).

    import orchestrator
    run = orchestrator.launch("hosts.txt", ["train.py", "--lr", "0.1"], run_dir="runs")
    for line in run.logs(follow=True):
        print(line)
    outcome = run.wait()          # outcome.state, .exit_code, .failure (rank, host, ...)

`launch` checks its input here, in the calling process (a `ConfigError` says what and where:
`hosts.txt:3: ...`), then starts the run's controller as a process of its own
(start/detach.py: no fork of the caller, no signal handler in it, nothing printed) and
returns once every node has started, or raises what stopped the start. Its keywords are the
`launch` flags (orchestrator/options/). The command line's attached launch (`start_attached`)
and `--detach` (`start_detached`) take the same `LaunchRequest`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from orchestrator.api.registry import backend_named
from orchestrator.api.request import LaunchRequest, build
from orchestrator.api.run_handle import Run
from orchestrator.errors import ConfigError, OrchestratorError, error_from_report
from orchestrator.hosts.hostfile import load_hostfile
from orchestrator.nodes.execute import NodeResult, results_table, run_command
from orchestrator.options.declare import keywords_of
from orchestrator.options.display import ConsoleOptions
from orchestrator.options.keywords import LaunchArgs, split_keywords
from orchestrator.options.reaching import SshOptions
from orchestrator.options.running import DEFAULT_RUN_DIR
from orchestrator.options.supervision import NODE_TASKS, Supervision
from orchestrator.options.workload import JobOptions
from orchestrator.record.runs import RunRecord
from orchestrator.slurm.control.exec_step import find_allocation, run_step

LOG = logging.getLogger("orchestrator")
Say = Callable[[str], None]


def launch(
    hostfile: str | Path | None = None,
    program: Sequence[str] = (),
    *,
    say: Say | None = None,
    **keywords,
) -> Run:
    """Start a run on every node of `hostfile` (`program`: the script and its arguments,
    as after `--`; empty for the bundled trainer) and return it once every node runs.
    `say`: where notes go (default: the `orchestrator` logger, nothing printed)."""
    args = LaunchArgs.of(keywords)
    argv = ("orchestrator.launch", *([str(hostfile)] if hostfile else []), "--", *program)
    request = build(str(hostfile) if hostfile else None, program, args, argv, say or LOG.info)
    report = start_detached(request)
    if "error" in report:
        raise started_error(report)
    return Run(request.options.run_id, request.options.run.run_dir)


def start_detached(request: LaunchRequest) -> dict:
    """The run's controller started as a process of its own; its report once every node
    runs (SLURM: once the job is submitted): {"started": True, ...} or {"error": ...}."""
    return backend_named(request.backend).start_detached(request)


def start_attached(request: LaunchRequest, dry_run: bool, out: BinaryIO) -> int:
    """The run driven from this process, its console on `out`; the exit code."""
    return backend_named(request.backend).launch(request, dry_run=dry_run, out=out)


def started_error(report: dict) -> OrchestratorError:
    """The error a detached start reported, of the type it had there (ConfigError,
    NodeError, NodeErrors, Interrupted, ...), its message and exit code."""
    return error_from_report(report)


def render(
    hostfile: str | Path | None,
    program: Sequence[str] = (),
    *,
    out_dir: str | Path,
    say: Say | None = None,
    argv: Sequence[str] | None = None,
    **keywords,
) -> list[Path]:
    """Write the plan and one torchrun script per node (or job.sbatch with
    backend="slurm") into `out_dir`, touching no node; the files written. `argv`: the
    command line the scripts' first line names."""
    args = LaunchArgs.of(keywords)
    if argv is None:  # the command line the scripts name as their origin
        argv = ("orchestrator", "render", *([str(hostfile)] if hostfile else []), "--", *program)
    hostfile = str(hostfile) if hostfile else None
    request = build(hostfile, program, args, argv, say or LOG.info, new_run=False)
    return backend_named(request.backend).render(request, str(out_dir))


# exec's flags: the interpreter of its agent, the time between SIGTERM and SIGKILL on a
# stop, the console's colour and folding, and every SSH flag.
EXEC_GROUPS = {
    "job": JobOptions,
    "supervision": Supervision,
    "console": ConsoleOptions,
    "ssh": SshOptions,
}
EXEC_KEYWORDS = ("python", "grace", "color", "fold", *keywords_of(SshOptions))


def check_timeout(timeout: float | None) -> None:
    """exec's --timeout, whichever way exec reaches the nodes."""
    if timeout is not None and timeout < 0:
        raise ConfigError(f"--timeout must be 0 or more, got {timeout:g} (keyword timeout)")


def exec_command(
    hostfile: str | Path,
    command: str,
    *,
    timeout: float | None = None,
    console: BinaryIO | None = None,
    **keywords,
) -> list[NodeResult]:
    """Run a shell command on every node of `hostfile` at once; each node's result (host,
    state, exit_code, output). `console`: where its attributed output goes as it comes
    (None: nowhere; the results hold it). `keywords`: exec's flags (`python`, `grace`,
    `color`, `fold` and the ssh flags)."""
    parts = split_keywords("exec", keywords, EXEC_GROUPS, EXEC_KEYWORDS)
    job = JobOptions(**parts["job"])
    supervision = replace(NODE_TASKS, **parts["supervision"])
    check_timeout(timeout)
    cluster = load_hostfile(str(hostfile))
    return run_command(
        cluster,
        command,
        job.python or sys.executable,
        SshOptions(**parts["ssh"]),
        supervision=supervision,
        time_limit=timeout,
        console=console,
        shown=ConsoleOptions(**parts["console"]),
    )


# exec --run's flags: no agent and no SSH there (srun reaches the job's nodes).
EXEC_RUN_GROUPS = {"supervision": Supervision, "console": ConsoleOptions}
EXEC_RUN_KEYWORDS = ("grace", "color", "fold")


def exec_on_run(
    run: str,
    command: str,
    *,
    run_dir: str | Path = DEFAULT_RUN_DIR,
    timeout: float | None = None,
    console: BinaryIO | None = None,
    **keywords,
) -> list[NodeResult]:
    """Run a shell command once on every node of the running SLURM run `run` (of
    `run_dir`), as a step of its job (slurm/control/exec_step.py); each node's result, as
    `exec_command` gives them. `keywords`: `grace`, `color`, `fold`. A run that is not a
    running SLURM job's, or was submitted with `login`, is a ConfigError saying why."""
    parts = split_keywords("exec", keywords, EXEC_RUN_GROUPS, EXEC_RUN_KEYWORDS)
    supervision = replace(NODE_TASKS, **parts["supervision"])
    check_timeout(timeout)
    allocation = find_allocation(RunRecord.open(run_dir, run))
    return run_step(
        allocation,
        command,
        grace=supervision.grace,
        time_limit=timeout,
        console=console,
        shown=ConsoleOptions(**parts["console"]),
    )


__all__ = [
    "exec_command",
    "exec_on_run",
    "launch",
    "render",
    "results_table",
    "start_attached",
    "start_detached",
]
