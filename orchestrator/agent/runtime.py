"""The container runtime on the node: what crosses into a job's container, and its removal.

The node script starts the runtime (templates/_container.sh.j2); inside, torchrun and the
ranks run with the image's python. The agent stays on the host and adds two things:

- `carried_names`: the variables it set for the job (the secrets, the node folder, the
  stack hook's and the flight recorder's), which the script passes into the container on
  its standard input (ORCHESTRATOR_CONTAINER_ENV names them), never on a command line;
- `remove`: once the step's processes are gone, `RUNTIME rm --force NAME`. A daemon's
  container (docker) is no descendant of the agent: its client may be gone while the
  container still runs. podman's is (conmon is reparented to the agent, the subreaper), but a
  conmon stopped with the rest may leave the stopped container in the store. So the agent
  removes it by its name, tied to the run and the node, whatever ended the step. The script
  writes the runtime it chose (`auto`) to RUNTIME_FILE in the node folder.

Standard library only: this module runs on the nodes too (see orchestrator.agent.bootstrap).
"""

from __future__ import annotations

import os
import subprocess

NAMES_ENV = "ORCHESTRATOR_CONTAINER_ENV"
RUNTIME_FILE = "container.runtime"  # in the node folder: the runtime the script chose
NAMED = ("docker", "podman")
REMOVE_TIMEOUT_S = 60.0
NOT_CARRIED = frozenset({"SHLVL", "PWD", "OLDPWD", "_"})


def carried_names(env: dict[str, str], inherited: dict[str, str]) -> str:
    """The names, space-separated, of what the agent set or changed in `env` over the
    environment it `inherited` (its login's)."""
    names = [
        name
        for name, value in env.items()
        if inherited.get(name) != value and name not in NOT_CARRIED and name.isidentifier()
    ]
    return " ".join(sorted(names))


def chosen_runtime(node_dir: str | None, asked: str) -> str | None:
    """The runtime the script ran: the one asked for, or (auto) the one it wrote down."""
    if asked in NAMED:
        return asked
    if asked != "auto" or not node_dir:
        return None
    try:
        with open(os.path.join(node_dir, RUNTIME_FILE), encoding="utf-8") as handle:
            found = handle.read().strip()
    except OSError:
        return None
    return found if found in NAMED else None


def remove(runtime: str, name: str) -> str | None:
    """`RUNTIME rm --force NAME` (a stopped container is removed, a running one killed
    first); what to tell the controller when that failed, else None."""
    try:
        done = subprocess.run(
            [runtime, "rm", "--force", name],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=REMOVE_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not remove container {name} ({runtime} rm): {exc}"
    words = done.stderr.lower()
    if done.returncode == 0 or "no such container" in words or "no container with name" in words:
        return None
    return f"could not remove container {name} ({runtime} rm): {done.stderr.strip()[-300:]}"
