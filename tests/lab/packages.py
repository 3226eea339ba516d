"""Debian prerequisites of the lab: find what is missing, install it without starting services."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.lab.state import machine_lock

# Package -> a file whose presence proves it is installed (cheaper and clearer than dpkg -s).
PACKAGES: dict[str, str] = {
    "openssh-server": "/usr/sbin/sshd",
    "slurmctld": "/usr/sbin/slurmctld",
    "slurmd": "/usr/sbin/slurmd",
    "slurm-client": "/usr/bin/sbatch",
    "munge": "/usr/sbin/munged",
    "pdsh": "/usr/bin/pdsh",
    # A node whose clock is off (faults.skew_clock): the faketime command pulls in the
    # libfaketime library that the node's sshd preloads into its sessions.
    "faketime": "/usr/bin/faketime",
    # A real terminal for live views (`orchestrator top`), driven and read by the tests.
    "tmux": "/usr/bin/tmux",
    # Containers on the nodes (containers.py): a daemonless runtime, and a Debian base
    # made from the package mirror for the lab's image.
    "podman": "/usr/bin/podman",
    "mmdebstrap": "/usr/bin/mmdebstrap",
}
SSH_PACKAGES = ("openssh-server",)
SLURM_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
CLOCK_PACKAGES = ("faketime",)
CONTAINER_PACKAGES = ("podman", "mmdebstrap")

POLICY_RC_D = Path("/usr/sbin/policy-rc.d")
# invoke-rc.d consults this script; exit status 101 means "action forbidden", so package
# installation never starts sshd, munged or slurmd on the machine's real interfaces.
_POLICY_DENY_ALL = (
    "#!/bin/sh\n# orchestrator lab: no service starts during package installation\nexit 101\n"
)


class LabUnavailable(RuntimeError):
    """This machine cannot host the lab; the message says exactly what is missing."""


def missing_packages(names: tuple[str, ...] | None = None) -> list[str]:
    """Packages of `names` (default: all of PACKAGES) that are not installed."""
    return [p for p in (names or tuple(PACKAGES)) if not Path(PACKAGES[p]).exists()]


def host_problems() -> list[str]:
    """What keeps this machine from hosting namespace nodes at all (empty list: nothing)."""
    problems: list[str] = []
    if os.geteuid() != 0:
        problems.append(f"not running as root (euid {os.geteuid()}); network namespaces need root")
    if shutil.which("ip") is None:
        problems.append("the `ip` command (Debian package iproute2) is not installed")
    elif os.geteuid() == 0:
        # Being uid 0 is not enough (containers, user namespaces): really create a namespace.
        name = f"olab-probe-{os.getpid()}"
        probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
        if probe.returncode != 0:
            why = probe.stderr.strip() or f"exit {probe.returncode}"
            problems.append(f"cannot create a network namespace (`ip netns add`): {why}")
        else:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return problems


@contextmanager
def services_forbidden() -> Iterator[None]:
    """Install a policy-rc.d that forbids service starts, unless one already does; undo after."""
    if POLICY_RC_D.exists():
        # An existing policy (e.g. a container image's "exit 101") is left exactly as it is.
        yield
        return
    POLICY_RC_D.write_text(_POLICY_DENY_ALL)
    POLICY_RC_D.chmod(0o755)
    try:
        yield
    finally:
        POLICY_RC_D.unlink(missing_ok=True)


def _apt_get(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", NEEDRESTART_MODE="a")
    cmd = ["apt-get", "-q", "-o", "DPkg::Lock::Timeout=300", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True)


def _has_candidates(names: list[str]) -> bool:
    out = subprocess.run(["apt-cache", "policy", *names], capture_output=True, text=True).stdout
    return out.count("Candidate:") == len(names) and "Candidate: (none)" not in out


def install_packages(names: list[str]) -> float:
    """Install `names` with apt-get (update first only when a package has no candidate).

    Returns the seconds spent. Raises LabUnavailable with apt's own words when it fails.
    """
    started = time.monotonic()
    with machine_lock("apt.lock"):
        names = [p for p in names if not Path(PACKAGES[p]).exists()]  # another session may have
        if not names:
            return time.monotonic() - started
        if shutil.which("apt-get") is None:
            raise LabUnavailable(f"packages {' '.join(names)} are missing and apt-get is absent")
        if not _has_candidates(names):
            update = _apt_get("update")
            if update.returncode != 0:
                raise LabUnavailable(f"`apt-get update` failed: {update.stderr.strip()[-600:]}")
        with services_forbidden():
            done = _apt_get("install", "-y", "--no-install-recommends", *names)
        if done.returncode != 0:
            raise LabUnavailable(
                f"`apt-get install {' '.join(names)}` failed: {done.stderr.strip()[-600:]}"
            )
    return time.monotonic() - started


def ensure_prerequisites(names: tuple[str, ...] | None = None) -> None:
    """Make sure the machine can host the lab with `names` installed, installing when root.

    Raises LabUnavailable naming exactly what is missing when it cannot.
    """
    problems = host_problems()
    missing = missing_packages(names)
    if missing and os.geteuid() != 0:
        problems.append(f"Debian packages missing, and not root to install: {' '.join(missing)}")
    if problems:
        raise LabUnavailable("; ".join(problems))
    if missing:
        install_packages(missing)
        still = missing_packages(names)
        if still:
            raise LabUnavailable(f"Debian packages still missing after install: {' '.join(still)}")
