"""The ranks' stack hook and torch's flight recorder, set up in the node folder for a step.

Standard library only: this module runs on the nodes too (see orchestrator.agent.bootstrap).
"""

from __future__ import annotations

import os

from orchestrator.agent.flight import FOLDER as FLIGHT_FOLDER
from orchestrator.agent.flight import flight_environment
from orchestrator.agent.stacks import HOOK_FOLDER, hook_environment

STACKS_FOLDER = "stacks"  # in the node directory: where the ranks' hooks write their stacks


def install_hook(source: str, node_dir: str, env: dict[str, str]) -> dict[str, str]:
    """The stack hook written into the node directory, and the script's environment that
    puts it first on the ranks' PYTHONPATH and turns torch's flight recorder on."""
    folder = os.path.join(node_dir, HOOK_FOLDER)
    os.makedirs(folder, exist_ok=True)
    os.makedirs(os.path.join(node_dir, STACKS_FOLDER), exist_ok=True)
    os.makedirs(os.path.join(node_dir, FLIGHT_FOLDER), mode=0o700, exist_ok=True)
    with open(os.path.join(folder, "sitecustomize.py"), "w", encoding="utf-8") as handle:
        handle.write(source)
    env = flight_environment(env, os.path.join(node_dir, FLIGHT_FOLDER))
    return hook_environment(env, folder, os.path.join(node_dir, STACKS_FOLDER))
