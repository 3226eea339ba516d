"""The launch backends by name (api/registry.py): every name --backend offers is one
backend's, each carries its own facts, and a name no backend has is refused."""

from __future__ import annotations

import pytest

from orchestrator.api.registry import BACKENDS, backend_named, recorded_backend
from orchestrator.errors import ConfigError
from orchestrator.options.backend_facts import AUTO, FACTS
from orchestrator.options.running import BACKENDS as OFFERED
from orchestrator.slurm.backend import SlurmBackend
from orchestrator.start.ssh_backend import LocalBackend, SshBackend


def test_backend_offers_the_registry_names_and_auto() -> None:
    assert OFFERED == (AUTO, *BACKENDS) == (AUTO, *FACTS)
    assert all(backend.facts is FACTS[name] for name, backend in BACKENDS.items())


def test_each_name_finds_its_backend_and_auto_is_ssh() -> None:
    assert type(backend_named("local")) is LocalBackend
    assert type(backend_named("ssh")) is SshBackend
    assert type(backend_named(AUTO)) is SshBackend
    assert type(backend_named("slurm")) is SlurmBackend
    with pytest.raises(ConfigError, match="--backend 'k8s': expected one of auto, local"):
        backend_named("k8s")


def test_a_record_naming_no_backend_we_know_is_an_ssh_runs() -> None:
    assert type(recorded_backend("slurm")) is SlurmBackend
    assert type(recorded_backend("local")) is LocalBackend
    assert type(recorded_backend(None)) is SshBackend
    assert type(recorded_backend("elsewhere")) is SshBackend


def test_only_a_scheduled_backend_outlives_its_controller() -> None:
    scheduled = {name for name, backend in BACKENDS.items() if backend.facts.scheduled}
    assert scheduled == {"slurm"}
    assert backend_named("local").facts.hosts_must_be_local
    assert not backend_named("ssh").facts.hosts_must_be_local
