"""A launch's options: the groups together, and the flat keywords of the Python API.

`orchestrator.launch(hostfile, program, grace=5, include="node1")` takes every flag of
`orchestrator launch` as a keyword named for its field; `LaunchArgs.of` hands each keyword
to the group that declares it, so each value is checked once, there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.options.choosing import Selection
from orchestrator.options.declare import OptionGroup, keywords_of
from orchestrator.options.display import ConsoleOptions
from orchestrator.options.image import ContainerOptions
from orchestrator.options.reaching import SshOptions
from orchestrator.options.running import RunOptions
from orchestrator.options.scheduler import SlurmOptions
from orchestrator.options.supervision import Supervision
from orchestrator.options.workload import JobOptions


def split_keywords(
    command: str,
    keywords: Mapping[str, Any],
    groups: Mapping[str, type[OptionGroup]],
    only: Collection[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """`keywords` by the name of the group each belongs to (of the groups' fields, `only`
    those a command takes); an unknown one is refused with the ones that are."""
    owner = {
        keyword: name
        for name, group in groups.items()
        for keyword in keywords_of(group)
        if only is None or keyword in only
    }
    unknown = sorted(set(keywords) - set(owner))
    if unknown:
        raise ConfigError(
            f"{command}: no keyword {unknown[0]!r}; the keywords are {command}'s flags: "
            + ", ".join(sorted(owner))
        )
    parts: dict[str, dict[str, Any]] = {name: {} for name in groups}
    for keyword, value in keywords.items():
        parts[owner[keyword]][keyword] = value
    return parts


@dataclass(frozen=True)
class LaunchArgs:
    """Every launch flag, in its group, with the command line's default."""

    job: JobOptions = field(default_factory=JobOptions)
    container: ContainerOptions = field(default_factory=ContainerOptions)
    hosts: Selection = field(default_factory=Selection)
    slurm: SlurmOptions = field(default_factory=SlurmOptions)
    run: RunOptions = field(default_factory=RunOptions)
    supervision: Supervision = field(default_factory=Supervision)
    console: ConsoleOptions = field(default_factory=ConsoleOptions)
    ssh: SshOptions = field(default_factory=SshOptions)

    @classmethod
    def groups(cls) -> dict[str, type[OptionGroup]]:
        return {item.name: item.default_factory for item in dataclasses.fields(cls)}  # type: ignore[misc]

    @classmethod
    def of(cls, keywords: Mapping[str, Any], command: str = "launch") -> LaunchArgs:
        """From flat keywords (the flags' names with `_`), each checked by its group."""
        groups = cls.groups()
        parts = split_keywords(command, keywords, groups)
        return cls(**{name: groups[name](**parts[name]) for name in groups})
