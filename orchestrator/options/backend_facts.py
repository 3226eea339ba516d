"""The launch backends by name, and the facts the stages below the API need of each, as data.

A backend is a class (start/launch_backend.py's `Backend`; local and ssh in
start/ssh_backend.py, slurm in slurm/backend.py) looked up by name in api/registry.py. The
stages below them (the option groups, the plan, the run record) cannot import those, so what
they need to know of a backend is here: one `BackendFacts` per name, read by the name
`--backend` or a status.json gives, never by comparing that name with a word. A new backend
adds its facts here and its class to the registry.
"""

from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"  # --backend's default: ssh (localhost entries run directly)
SSH_RUNTIMES = ("docker", "podman", "apptainer")
SLURM_RUNTIMES = ("pyxis", "apptainer")


@dataclass(frozen=True)
class BackendFacts:
    """What a caller may ask of a backend without starting it."""

    name: str  # as --backend and status.json's "backend" give it
    family: str  # the launch it takes, as messages name it: local is ssh's, every host here
    container_runtimes: tuple[str, ...]  # the --container-runtime values it runs, besides auto
    scheduled: bool  # a scheduler runs the job: it outlives the controller, which follows it
    hosts_must_be_local: bool  # every host of the hostfile must be this machine
    exec_in_job_step: bool  # `exec --run` reaches a running run's nodes (a step of its job)


LOCAL = BackendFacts(
    name="local",
    family="ssh",
    container_runtimes=SSH_RUNTIMES,
    scheduled=False,
    hosts_must_be_local=True,
    exec_in_job_step=False,
)
SSH = BackendFacts(
    name="ssh",
    family="ssh",
    container_runtimes=SSH_RUNTIMES,
    scheduled=False,
    hosts_must_be_local=False,
    exec_in_job_step=False,
)
SLURM = BackendFacts(
    name="slurm",
    family="slurm",
    container_runtimes=SLURM_RUNTIMES,
    scheduled=True,
    hosts_must_be_local=False,
    exec_in_job_step=True,
)
FACTS = {facts.name: facts for facts in (LOCAL, SSH, SLURM)}
ALIASES = {AUTO: SSH.name}
CHOICES = (AUTO, *FACTS)  # what --backend offers
# What a run record that names no backend we know (or none) is taken for: not scheduled,
# as every such record was before.
UNKNOWN = BackendFacts(
    name="",
    family="",
    container_runtimes=(),
    scheduled=False,
    hosts_must_be_local=False,
    exec_in_job_step=False,
)


def facts_of(name: str | None) -> BackendFacts:
    """The facts of the backend `name` (auto: ssh); UNKNOWN for a name none has (an old or
    foreign run record)."""
    return FACTS.get(ALIASES.get(name or "", name or ""), UNKNOWN)
