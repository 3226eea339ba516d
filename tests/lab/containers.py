"""Containers on the lab's nodes: podman, an image built here, and what crun needs.

No registry is reachable from the lab, so the image is made on this machine: a Debian base
from the package mirror (mmdebstrap, minbase), with this test run's interpreter and virtual
environment appended at the paths they have here, imported into podman's store (shared by
every namespace node, as they share the file system). The image holds the same python,
torch and job environment the nodes run without a container (their bytecode caches too: a
container's writes are thrown away with it, so without them every import in every
container would compile from source); its name carries a digest of those paths and
versions, so it is built once per environment and kept between suites.

What crun needs on these machines, which a real node would not: a containers.conf with
cgroups disabled and rlimits it may set (raising them is refused here), and a cgroup2 file
system in each node's mount namespace (cluster.py starts each sshd in one when asked).
These are the site's settings, written where a site keeps them.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.lab.packages import CONTAINER_PACKAGES, LabUnavailable, ensure_prerequisites
from tests.lab.state import machine_lock

PODMAN = "/usr/bin/podman"
CONTAINERS_CONF = Path("/etc/containers/containers.conf")
LAB_CONF = """\
# orchestrator lab: crun on this machine (no cgroup delegation, rlimits cannot be raised)
[containers]
cgroups = "disabled"
default_ulimits = ["nofile=20000:20000", "nproc=30000:30000"]
"""
SUITE = "bookworm"
RECIPE = "3"  # bumped when the image's making changes, so the name (and the image) change
PATH_IN_IMAGE = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def environment_paths() -> list[str]:
    """What the image must hold for this run's jobs: the interpreter's installation and the
    virtual environment (with torch) that the nodes use."""
    paths = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}
    return sorted(paths)


def unimportable_paths() -> list[str]:
    """What of the interpreter's installation this run's jobs never import, left out of the
    image: from a virtual environment without the system's site-packages, the
    installation's site-packages (whatever else was installed on this machine: 685 MB of
    the image's 2.2 GB in the lab) and CPython's own regression tests (lib/pythonX.Y/test)."""
    base = os.path.realpath(sys.base_prefix)
    if os.path.realpath(sys.prefix) == base:
        return []
    stdlib = os.path.join(base, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    importable = {os.path.realpath(path) for path in sys.path if path}
    unused = [os.path.join(stdlib, "test")]
    if os.path.join(stdlib, "site-packages") not in importable:
        unused.append(os.path.join(stdlib, "site-packages"))
    return [path for path in unused if os.path.isdir(path)]


def image_name() -> str:
    """localhost/orchestrator-lab:<digest of the environment's paths and versions>."""
    import torch

    facts = [*environment_paths(), sys.version, torch.__version__, SUITE, RECIPE]
    digest = hashlib.sha256("\n".join(facts).encode()).hexdigest()[:12]
    return f"localhost/orchestrator-lab:{digest}"


def configure_runtime() -> None:
    """The site's containers.conf for crun on this machine (see the module docstring)."""
    if CONTAINERS_CONF.exists() and CONTAINERS_CONF.read_text() == LAB_CONF:
        return
    if CONTAINERS_CONF.exists() and "orchestrator lab" not in CONTAINERS_CONF.read_text():
        raise LabUnavailable(f"{CONTAINERS_CONF} exists and is not the lab's; not overwritten")
    CONTAINERS_CONF.parent.mkdir(parents=True, exist_ok=True)
    CONTAINERS_CONF.write_text(LAB_CONF)


def ensure_image() -> str:
    """The lab's image, built if this machine's store lacks it; returns its name."""
    ensure_prerequisites(CONTAINER_PACKAGES)
    configure_runtime()
    name = image_name()
    with machine_lock("image.lock"):
        if podman("image", "exists", name).returncode == 0:
            return name
        build_image(name)
    return name


def build_image(name: str) -> None:
    """mmdebstrap's minbase, this environment appended, `podman import` (about two minutes)."""
    with tempfile.TemporaryDirectory(prefix="orchestrator-lab-image-") as tmp:
        tar = Path(tmp) / "base.tar"
        step(
            ["mmdebstrap", "--quiet", "--variant=minbase", "--include=iproute2,procps",
             SUITE, str(tar)],
            "mmdebstrap (a Debian base from the package mirror)",
        )  # fmt: skip
        relative = [path.lstrip("/") for path in environment_paths()]
        left_out = [f"--exclude={path.lstrip('/')}" for path in unimportable_paths()]
        step(
            ["tar", "--append", "-f", str(tar), "--anchored", *left_out, "-C", "/", *relative],
            "appending the interpreter and environment",  # their bytecode too
        )
        path = f"{sys.prefix}/bin:{PATH_IN_IMAGE}"
        step(
            [PODMAN, "import", "--quiet", "--change", f"ENV PATH={path}", str(tar), name],
            "podman import",
        )


def step(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise LabUnavailable(f"building the lab's image: {what} failed: {done.stderr.strip()}")


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """podman on this machine (the nodes share its store)."""
    return subprocess.run([PODMAN, *args], capture_output=True, text=True, timeout=timeout)


def containers_named(prefix: str) -> list[str]:
    """Every container in the store (running or not) whose name starts with `prefix`."""
    done = podman("ps", "-a", "--format", "{{.Names}}")
    return [n for n in done.stdout.split() if n.startswith(prefix)]
