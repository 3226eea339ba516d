"""--container under --backend slurm: how job.sbatch runs torchrun and the ranks inside the
image (orchestrator/plan/container.py holds what was asked). Pure: the template renders it.

Two runtimes; `auto` is pyxis, or apptainer for a .sif image (ContainerSpec.slurm_runtime):

- pyxis, enroot's SLURM plugin: srun's own --container-image, --container-mounts and
  --container-workdir flags (then the --container-arg flags), so that srun starts its task
  inside the image. The task keeps the job's environment, exported bash functions included,
  as it does without a container. The container has no name: pyxis removes it when the task
  ends.
- apptainer: srun's task runs `apptainer exec [--nv] --bind ... --pwd DIR [ARGS] IMAGE bash
  -c ...` on each node (--nv where the node has NVIDIA's driver). Without --cleanenv the
  host's environment crosses, but not its exported bash functions: their BASH_FUNC_*
  variables do not have valid names, and apptainer leaves them out. So the bash inside gets
  their definitions as its command (orchestrator_apptainer in the template).

Either way the image sees, at their own paths, the working directory and the run's job
folder (where the nodes write their ranks' output and exit codes; launch only), then the
--container-mounts; the ranks start in --container-workdir, else the working directory.
The python that runs torchrun and the ranks is the image's (--container-python).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from orchestrator.errors import ConfigError
from orchestrator.plan.container import ContainerSpec
from orchestrator.plan.launch_plan import container_entry


@dataclass(frozen=True)
class SlurmContainer:
    """The job's container as job.sbatch runs it, every value decided."""

    spec: ContainerSpec  # as asked, with the runtime resolved: pyxis or apptainer
    srun_args: tuple[str, ...] = ()  # pyxis: srun's flags
    exec_args: tuple[str, ...] = ()  # apptainer: after `apptainer exec [--nv]`, to the image

    def entry(self) -> dict[str, dict]:
        """plan.yaml's `container:`, with the runtime the script was rendered for."""
        return container_entry(self.spec)


def container_fields(
    container: ContainerSpec | None, python: str, workdir: str, job_dir: str | None
) -> dict[str, object]:
    """The SlurmJob fields a container decides: the interpreter of torchrun and the ranks
    (the image's, else the node's `python`) and how the script starts the image."""
    if container is None:
        return {"python": python, "container": None}
    return {"python": container.python, "container": slurm_container(container, workdir, job_dir)}


def slurm_container(container: ContainerSpec, workdir: str, job_dir: str | None) -> SlurmContainer:
    """The container with its runtime resolved and that runtime's arguments."""
    spec = replace(container, runtime=container.slurm_runtime())
    if spec.runtime == "pyxis":
        return SlurmContainer(spec, srun_args=srun_container_args(spec, workdir, job_dir))
    return SlurmContainer(spec, exec_args=apptainer_exec_args(spec, workdir, job_dir))


def container_mounts(
    container: ContainerSpec, workdir: str, job_dir: str | None
) -> tuple[str, ...]:
    """SOURCE:TARGET[:ro] for the image: the working directory (the code) and the job
    folder (the files the nodes write) at their own paths, then the user's."""
    own = (workdir, job_dir) if job_dir else (workdir,)
    for path in own:
        if ":" in path or "," in path:
            raise ConfigError(
                f"{path!r}: a container mount cannot name a folder whose path holds ':' or ','; "
                "run from another folder (--workdir, --run-dir)"
            )
    for mount in container.mounts:
        if mount.source.startswith("~/"):  # the SSH node script expands ~ on the node
            raise ConfigError(
                f"container mount {mount.spec()!r}: under --backend slurm give the source "
                "as an absolute path (neither pyxis nor apptainer expands ~)"
            )
    return tuple(f"{path}:{path}" for path in own) + tuple(m.spec() for m in container.mounts)


def srun_container_args(
    container: ContainerSpec, workdir: str, job_dir: str | None
) -> tuple[str, ...]:
    """pyxis: srun's flags that start its task in the image, then the user's own."""
    mounts = ",".join(container_mounts(container, workdir, job_dir))
    return (
        f"--container-image={container.image}",
        f"--container-mounts={mounts}",
        f"--container-workdir={container.workdir or workdir}",
        *container.args,
    )


def apptainer_exec_args(
    container: ContainerSpec, workdir: str, job_dir: str | None
) -> tuple[str, ...]:
    """apptainer: what follows `apptainer exec [--nv]`, up to the image. No --cleanenv: the
    ranks get the job's environment (and the secrets) from the host's."""
    binds = [
        word
        for mount in container_mounts(container, workdir, job_dir)
        for word in ("--bind", mount)
    ]
    return (*binds, "--pwd", container.workdir or workdir, *container.args, container.image)
