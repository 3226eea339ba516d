"""The launch backends by name: the one place a backend's name becomes its class
(start/launch_backend.py's `Backend`). `--backend` offers these names (and auto, for ssh),
from options/backend_facts.py, whose facts each class carries; tests/unit/test_layout.py
keeps every other module from comparing a backend's name with a word.
"""

from __future__ import annotations

from orchestrator.errors import ConfigError
from orchestrator.options.backend_facts import ALIASES, CHOICES, SSH, facts_of
from orchestrator.slurm.backend import SlurmBackend
from orchestrator.start.launch_backend import Backend
from orchestrator.start.ssh_backend import LocalBackend, SshBackend

BACKENDS: dict[str, Backend] = {
    each.name: each for each in (LocalBackend(), SshBackend(), SlurmBackend())
}


def backend_named(name: str) -> Backend:
    """The backend `--backend NAME` names (auto: ssh); a ConfigError for a name none has."""
    backend = BACKENDS.get(ALIASES.get(name, name))
    if backend is None:
        raise ConfigError(f"--backend {name!r}: expected one of {', '.join(CHOICES)}")
    return backend


def recorded_backend(name: str | None) -> Backend:
    """The backend a run record names; one that names none we know (an older record) was
    an SSH run's, as every such record was taken for before."""
    return BACKENDS.get(facts_of(name).name, BACKENDS[SSH.name])
