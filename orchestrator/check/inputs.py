"""What `orchestrator check` is asked to do (`CheckOptions`), and the flags refused before
any node is contacted: a --max-size no rank could hold, a --json FILE that could not be
written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import orchestrator.sizes as sizes
from orchestrator.errors import ConfigError
from orchestrator.plan.container import ContainerSpec


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
    max_size: int | None = None  # None: measure.DEFAULT_MAX_SIZE of the backend
    skip_bandwidth: bool = False
    timeout: float = 180.0
    json_path: str | None = None
    ssh: object | None = None  # orchestrator.options.reaching.SshOptions
    forward_env: bool = True
    container: ContainerSpec | None = None  # --container: the facts and the job in the image


MAX_SWEEP_SIZE = 4 << 30  # every rank holds buffers of this size; beyond it is a typo


def parse_max_size(text: str) -> int:
    """--max-size as bytes: a readable size of at most MAX_SWEEP_SIZE, else ConfigError."""
    try:
        size = sizes.parse_size(text)
    except ValueError as exc:
        raise ConfigError(f"--max-size: {exc}") from None
    if size > MAX_SWEEP_SIZE:
        raise ConfigError(
            f"--max-size {text!r}: at most {sizes.format_size(MAX_SWEEP_SIZE)} "
            f"({MAX_SWEEP_SIZE} bytes), as every rank allocates buffers of this "
            "size; give e.g. 1G"
        )
    return size


def check_json_path(path: str) -> None:
    """Refuse a --json FILE that could not be written, before any node is contacted."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        problem = "is not a folder" if os.path.exists(folder) else "does not exist"
        raise ConfigError(
            f"--json {path}: {folder} {problem}; create that folder first or give another path"
        )
    if os.path.isdir(path):
        raise ConfigError(f"--json {path}: is a folder; give a file path")
    writable = (
        os.access(path, os.W_OK) if os.path.exists(path) else os.access(folder, os.W_OK | os.X_OK)
    )
    if not writable:
        raise ConfigError(f"--json {path}: cannot write it: permission denied")
