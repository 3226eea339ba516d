"""orchestrator: launch multi-node PyTorch jobs from a hostfile.

The Python API, for a sweep script, a notebook or another tool (see docs/api.md):

    import orchestrator
    run = orchestrator.launch("hosts.txt", ["train.py", "--lr", "0.1"])
    outcome = run.wait()        # .state, .exit_code, .failure (rank, host, last lines)

`launch`, `attach`, `render`, `exec_command`, `exec_on_run`, `check_nodes`, `clean_nodes`, `Run`,
`RunOutcome`, `RunStatus`, `RunState`, `Failure` and the errors (`OrchestratorError`,
`ConfigError`, `RunFailed`, ...) are named here and imported on first use: `python -m
orchestrator.trainer` on a node imports this package without them.

__main__.py  `python -m orchestrator`: the command line
errors.py    the error hierarchy: every foreseeable failure is one of these, written for a user
hostlist.py  SLURM-style host lists
numerals.py  whole numbers as people type them
sizes.py     sizes in bytes as people write them: 64M, 1G, 512KiB (binary units), and back
version.py   the package's version: the one place it is written (pyproject.toml reads it here)
agent/       the node agent: a package on the controller, one process on each node
api/         acting on runs from any shell or program
attempts/    what follows an attempt of a run, decided once for every backend
backends/    how the controller reaches a node (local subprocess, SSH): the node backends
check/       `orchestrator check`: prove a cluster is ready
cli/         the command line
console/     what a person reads
hosts/       hostfiles and choosing hosts and slots out of them
nodes/       work on every node at once through its agent
options/     one model of a launch
plan/        planning, pure (no network)
record/      the run record
slurm/       the SLURM backend: one sbatch job for the whole run
start/       launching a job
supervise/   supervision of a started run
trainer/     the bundled DDP trainer: `python -m orchestrator.trainer` (usually under torchrun)
"""

from __future__ import annotations

from orchestrator.version import __version__

_API = {
    "launch": "orchestrator.api.launching",
    "render": "orchestrator.api.launching",
    "exec_command": "orchestrator.api.launching",
    "exec_on_run": "orchestrator.api.launching",
    "check_nodes": "orchestrator.api.node_tasks",
    "clean_nodes": "orchestrator.api.node_tasks",
    "attach": "orchestrator.api.run_handle",
    "runs_in": "orchestrator.api.run_handle",
    "Run": "orchestrator.api.run_handle",
    "RunOutcome": "orchestrator.api.run_handle",
    "Failure": "orchestrator.api.run_handle",
    "RunStatus": "orchestrator.api.run_handle",
    "RunState": "orchestrator.api.run_handle",
    "OrchestratorError": "orchestrator.errors",
    "ConfigError": "orchestrator.errors",
    "SourceError": "orchestrator.errors",
    "NodeError": "orchestrator.errors",
    "NodeErrors": "orchestrator.errors",
    "Interrupted": "orchestrator.errors",
    "RunFailed": "orchestrator.errors",
    "RunNotReachable": "orchestrator.errors",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
