"""A job in a container image: which runtime, which image, what is mounted, and the exact
command each node runs. Pure: the node script and job.sbatch render what this decides.

torchrun and the ranks run inside the image, with its python and torch; the node's agent
stays on the host and supervises as without one. So the container shares the node's network
(`--network host`: MASTER_ADDR, the port and the interface the probe chose are right inside)
and IPC (`--ipc host`: the shared memory data loaders use), and it sees, at the same paths,
what the ranks read and write: the node script itself, the run's node folder (rank output,
metrics, stack hook, flight recorder dumps) and the working directory (a --sync copy is
one). The ranks run as the user who launched, so their files are that user's.

Runtimes, over SSH: docker and podman (`run`, a container named for the run and the node,
removed when it ends), apptainer (`exec`; no daemon, no name). Under SLURM: pyxis (srun's
`--container-*` flags) and apptainer (`srun apptainer exec`). `auto` is resolved on each
node, at launch by the preflight probe, in a script run by hand when it starts.

Environment: what the launch sets for the ranks (and the secrets) crosses into the container
on its standard input, read by the script inside before torchrun starts: never as `-e
NAME=VALUE`, which `ps` and `docker inspect` would show.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from orchestrator.errors import ConfigError, SourceError
from orchestrator.options.backend_facts import facts_of
from orchestrator.options.image import AUTO, RUNTIMES, ContainerOptions

# `auto` on a node: the first of these it has (the probe says which it found).
AUTO_ORDER = ("docker", "podman", "apptainer")
DEFAULT_PYTHON = "python3"
KEYS = ("image", "runtime", "mounts", "workdir", "args", "python")
_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_.-]")
_IMAGE = re.compile(r"^[^\s'\"\\$`;|&<>]+$")


@dataclass(frozen=True)
class Mount:
    """SOURCE:TARGET[:ro] (a host path, where the container sees it)."""

    source: str
    target: str
    read_only: bool = False

    def spec(self) -> str:
        """docker/podman `-v`, apptainer `--bind` and pyxis `--container-mounts` spelling."""
        return f"{self.source}:{self.target}" + (":ro" if self.read_only else "")


@dataclass(frozen=True, kw_only=True)
class ContainerSpec:
    """The container a job runs in, as asked (flags, or the hostfile's `container:`)."""

    image: str
    runtime: str = AUTO
    mounts: tuple[Mount, ...] = ()
    workdir: str | None = None  # where the ranks start inside; default: the job's workdir
    args: tuple[str, ...] = ()  # the runtime's own flags, passed through as given
    python: str = DEFAULT_PYTHON  # the image's interpreter (and its torchrun)

    def __post_init__(self) -> None:
        if not self.image or not _IMAGE.fullmatch(self.image):
            raise ConfigError(
                f"--container {self.image!r}: expected an image name (docker/podman: "
                "registry/name:tag, pyxis: registry#name:tag, apptainer: a .sif path)"
            )
        if self.runtime not in RUNTIMES:
            raise ConfigError(
                f"--container-runtime {self.runtime!r}: expected one of {', '.join(RUNTIMES)}"
            )
        if self.workdir is not None and not self.workdir.startswith("/"):
            raise ConfigError(
                f"--container-workdir {self.workdir!r}: expected an absolute path in the image"
            )
        if not self.python or any(c in self.python for c in "\n\r\x00"):
            raise ConfigError(f"--container-python {self.python!r}: expected an interpreter")

    def for_backend(self, backend: str) -> ContainerSpec:
        """Checked against the backend: pyxis only under SLURM, docker/podman only over SSH."""
        facts = facts_of(backend)
        allowed = facts.container_runtimes
        if self.runtime not in (AUTO, *allowed):
            raise ConfigError(
                f"--container-runtime {self.runtime} does not run under the {facts.family} "
                f"backend; there: {', '.join((AUTO, *allowed))}"
            )
        return self

    def slurm_runtime(self) -> str:
        """Under SLURM `auto` is pyxis (srun's --container-image), unless the image is an
        apptainer file (.sif)."""
        if self.runtime != AUTO:
            return self.runtime
        return "apptainer" if self.image.endswith(".sif") else "pyxis"

    def describe(self) -> str:
        runtime = "runtime chosen on each node" if self.runtime == AUTO else self.runtime
        return f"container {self.image} ({runtime})"


def parse_mounts(text: str, where: str = "--container-mounts") -> tuple[Mount, ...]:
    """`SRC:DST[:ro|rw],...`; SRC a host path (absolute or ~/...), DST absolute."""
    mounts = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        parts = item.split(":")
        if len(parts) == 2:
            parts.append("rw")
        if len(parts) != 3 or parts[2] not in ("ro", "rw"):
            raise ConfigError(
                f"{where} {item!r}: expected SOURCE:TARGET or SOURCE:TARGET:ro, e.g. /data:/data:ro"
            )
        source, target, flag = parts
        if not (source.startswith("/") or source.startswith("~/")):
            raise ConfigError(f"{where} {item!r}: the source must be an absolute path or ~/...")
        if not target.startswith("/"):
            raise ConfigError(f"{where} {item!r}: the target must be an absolute path")
        for path in (source, target):
            if any(c in path for c in "\n\r\x00,"):
                raise ConfigError(f"{where} {item!r}: a path holds a control character")
        normal = str(PurePosixPath(target))
        mounts.append(Mount(source, normal, read_only=flag == "ro"))
    return tuple(mounts)


def from_mapping(pairs: tuple[tuple[str, object], ...], source: str) -> ContainerSpec:
    """The hostfile's `container:` ((key, value) pairs as read: strings, or tuples of
    strings for mounts and args); a problem is a SourceError at `source` ("path:line")."""
    values = dict(pairs)
    path, _, line = source.rpartition(":")
    try:
        unknown = sorted(set(values) - set(KEYS))
        if unknown:
            raise ConfigError(f"unknown container key {unknown[0]!r}; valid: {', '.join(KEYS)}")
        if "image" not in values:
            raise ConfigError("container: needs an image (image: registry/name:tag)")
        mounts = values.get("mounts", ())
        mounts_text = mounts if isinstance(mounts, str) else ",".join(mounts)  # type: ignore[arg-type]
        args = values.get("args", ())
        if isinstance(args, str):
            args = shlex.split(args)
        return ContainerSpec(
            image=str(values["image"]),
            runtime=str(values.get("runtime", AUTO)),
            mounts=parse_mounts(str(mounts_text), "container mounts"),
            workdir=str(values["workdir"]) if "workdir" in values else None,
            args=tuple(str(a) for a in args),  # type: ignore[union-attr]
            python=str(values.get("python", DEFAULT_PYTHON)),
        )
    except ConfigError as exc:
        raise SourceError(path, int(line) if line.isdigit() else None, str(exc)) from None


def job_container(
    hostfile: tuple[tuple[str, object], ...] | None,
    source: str,
    backend: str,
    flags: ContainerOptions,
) -> ContainerSpec | None:
    """The job's container: the hostfile's `container:` (`hostfile`, at `source`) with the
    --container flags over it (a flag not given keeps the hostfile's value), checked against
    the backend. No image in either: no container, and no other --container flag."""
    given: dict[str, object] = {
        "image": flags.container,
        "runtime": flags.container_runtime,
        "workdir": flags.container_workdir,
        "python": flags.container_python,
    }
    if flags.container_mounts is not None:
        given["mounts"] = parse_mounts(flags.container_mounts)
    if flags.container_args:
        given["args"] = flags.container_args
    chosen = {key: value for key, value in given.items() if value is not None}
    if hostfile is None:
        if "image" not in chosen:
            if chosen:
                flag = sorted(chosen)[0].replace("args", "arg")
                raise ConfigError(f"--container-{flag} given without --container IMAGE")
            return None
        spec = ContainerSpec(**chosen)  # type: ignore[arg-type]
    else:
        base = from_mapping(hostfile, source)
        spec = ContainerSpec(**{**{key: getattr(base, key) for key in KEYS}, **chosen})  # type: ignore[arg-type]
    return spec.for_backend(backend)


def container_name(run_id: str, node_rank: int, attempt: int = 1) -> str:
    """The container of `run_id` on node `node_rank` (in a relaunch onto a spare, of its
    attempt): the runtime stops and removes it by this name, so two runs on the same nodes
    never touch each other's, nor a relaunch a container its first attempt left."""
    again = f"-attempt{attempt}" if attempt > 1 else ""
    return _NAME_CHARS.sub("_", f"orchestrator-{run_id}{again}-node{node_rank}")
