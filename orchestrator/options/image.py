"""The container group: --container IMAGE and how it runs (launch, render, check)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.options.declare import OptionGroup, option

AUTO = "auto"
RUNTIMES = (AUTO, "docker", "podman", "apptainer", "pyxis")


@dataclass(frozen=True)
class ContainerOptions(OptionGroup):
    """The --container flags as given; plan/container.py puts them over a hostfile's
    `container:` and checks them against the backend."""

    container: str | None = option(
        None,
        "Run torchrun and the ranks inside this image (the agent stays on the host): "
        "docker/podman registry/name:tag, pyxis registry#name:tag, apptainer a .sif. The "
        "container shares the node's network and IPC; the working directory, the run's node "
        "folder and --sync copies are mounted at their own paths. A YAML hostfile's "
        "`container:` says the same; these flags win.",
        metavar="IMAGE",
    )
    container_runtime: str | None = option(
        None,
        "Over SSH: docker, podman or apptainer; under SLURM: pyxis or apptainer. Default "
        "auto: on each node docker (if its daemon answers), else podman, else apptainer (the "
        "preflight says which); under SLURM pyxis, or apptainer for a .sif.",
        metavar="[" + "|".join(RUNTIMES) + "]",
        choices=RUNTIMES,
    )
    container_mounts: str | None = option(
        None,
        "More host paths to mount (comma-separated), e.g. /data:/data:ro.",
        metavar="SRC:DST[:ro],...",
    )
    container_workdir: str | None = option(
        None,
        "Where the ranks start inside the image. Default: the job's working directory.",
        metavar="DIR",
    )
    container_args: tuple[str, ...] = option(
        (),
        "A flag passed to the runtime as is (repeatable), e.g. --container-arg=--shm-size=8g.",
        name="--container-arg",
        metavar="ARG",
        repeat=True,
    )
    container_python: str | None = option(
        None, "The image's interpreter, with torch. Default: python3.", metavar="PATH"
    )
