"""Bad days made on purpose (LAB.md): a node whose clock is off, a process that freezes, a
node switched off without a word.

- Clock skew: Debian's libfaketime, preloaded by the node's sshd into every session
  (`SetEnv LD_PRELOAD=... FAKETIME=-0.05s`), shifts the wall clock of everything started
  over SSH on that node. FAKETIME_DONT_FAKE_MONOTONIC stays unset: with it, python's
  time.sleep fails with EINVAL under torchrun. The lab's own processes, the controller
  included, keep the machine's clock.
- Freezing: SIGSTOP, then SIGCONT, to chosen pids (an agent, a whole node but its sshd, the
  controller). A stopped process holds its sockets open, so its peers see silence, not EOF.
- Power loss: the node's link goes down first (so no FIN or RST leaves it), then every
  process in its namespace, sshd included, is SIGKILLed.
- A slow CPU: chosen processes moved into a cgroup of their own whose CPU quota is a small
  share of one core (cgroup v2 `cpu.max`, or v1 `cpu.cfs_quota_us`), so they compute slowly
  and wait as fast as ever. (nice and taskset do not do it here: with autogroup, nice only
  ranks a process within its own session.)
- A small disk: a tmpfs of a few MiB mounted over a folder in the mount namespace of one
  node's sshd, so only the sessions of that node see it (and fill it).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tests.lab.packages import CLOCK_PACKAGES, ensure_prerequisites

if TYPE_CHECKING:
    from tests.lab.cluster import Cluster
    from tests.lab.faults import Proc
    from tests.lab.netns import Node

SSHD = "/usr/sbin/sshd"
AGENT_ARGV0 = "orchestrator-agent"  # the bootstrap's sys.argv[0] (agent/bootstrap.py)


# ----- clock skew --------------------------------------------------------------------------


def faketime_library() -> str:
    """The path of libfaketime.so.1 as this machine's dpkg installed it (multiarch)."""
    ensure_prerequisites(CLOCK_PACKAGES)
    listed = subprocess.run(
        ["dpkg", "-L", "libfaketime"], capture_output=True, text=True, check=True
    ).stdout.split()
    found = [p for p in listed if p.endswith("/libfaketime.so.1")]
    if not found:
        raise RuntimeError("dpkg -L libfaketime lists no libfaketime.so.1")
    return found[0]


def faketime_offset(seconds: float) -> str:
    """FAKETIME's relative form: -0.05 -> '-0.05s', 30 -> '+30s'."""
    return f"{seconds:+g}s"


def with_set_env(config: str, assignments: str) -> str:
    """`config` with `assignments` added to its SetEnv (sshd honours only the first line)."""
    pattern = re.compile(r"^SetEnv[ \t]+(.*)$", re.M | re.I)
    if pattern.search(config):
        return pattern.sub(lambda m: f"SetEnv {m.group(1).strip()} {assignments}", config, 1)
    return config.rstrip("\n") + f"\nSetEnv {assignments}\n"


class FaketimeShared:
    """A POSIX semaphore and shared memory that libfaketime's processes share, owned here.

    Named `FAKETIME_SHARED` in the sessions' environment, they exist before the first faked
    process starts and after the last one ends, so no process creates or removes them."""

    _SHM_BYTES = 4096  # one page: more than libfaketime's shared struct

    def __init__(self, tag: str) -> None:
        self.sem_name = f"/orchestrator_lab_faketime_sem_{tag}"
        self.shm_name = f"/orchestrator_lab_faketime_shm_{tag}"
        self._libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self._libc.sem_open.restype = ctypes.c_void_p
        self._libc.sem_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_uint]
        self._libc.sem_close.argtypes = [ctypes.c_void_p]
        self._libc.sem_unlink.argtypes = [ctypes.c_char_p]

    @property
    def env_value(self) -> str:
        return f"{self.sem_name} {self.shm_name}"

    def create(self) -> None:
        self.remove()
        sem = self._libc.sem_open(self.sem_name.encode(), os.O_CREAT | os.O_EXCL, 0o600, 1)
        if sem in (None, ctypes.c_void_p(-1).value):
            err = ctypes.get_errno()
            raise OSError(err, f"sem_open {self.sem_name}: {os.strerror(err)}")
        self._libc.sem_close(sem)
        # What libfaketime's own creator writes: no ticks, no file index, start times unset
        # (tv_nsec -1 for the real, monotonic and raw monotonic clocks).
        state = bytearray(self._SHM_BYTES)
        for offset in (24, 40, 56):
            state[offset : offset + 8] = (-1).to_bytes(8, "little", signed=True)
        Path("/dev/shm", self.shm_name.lstrip("/")).write_bytes(bytes(state))
        os.chmod(Path("/dev/shm", self.shm_name.lstrip("/")), 0o600)

    def remove(self) -> None:
        self._libc.sem_unlink(self.sem_name.encode())
        Path("/dev/shm", self.shm_name.lstrip("/")).unlink(missing_ok=True)


def measured_shift(cluster: Cluster, node: Node) -> tuple[float, float]:
    """(shifted - real bounds) of `date` in a session on `node`: the shift lies in between.

    The shifted `date` runs between two unshifted ones, so shifted - real lies within
    [shifted - second, shifted - first]."""
    command = "env -u LD_PRELOAD date +%s.%N && date +%s.%N && env -u LD_PRELOAD date +%s.%N"
    status, out, err = cluster.ssh_run(node, command, timeout=30)
    if status != 0 or len(out.split()) != 3:
        raise RuntimeError(f"date on {node.name} failed ({status}): {out.strip()} {err.strip()}")
    first, shifted, second = (float(x) for x in out.split())
    return shifted - second, shifted - first


@contextlib.contextmanager
def skew_clock(cluster: Cluster, node: Node, seconds: float) -> Iterator[None]:
    """Within the block, every session started over SSH on `node` has its clock `seconds` off.

    Processes started before the block keep the true clock. Verified with `date` over ssh
    before the block begins; the sshd config is restored (and sshd restarted) after it.
    """
    library = faketime_library()
    shared = FaketimeShared(node.name)
    shared.create()
    path = node.sshd_config_path
    original = path.read_text()
    # SetEnv splits on spaces unless quoted; FAKETIME_SHARED holds two names.
    assignments = (
        f"LD_PRELOAD={library} FAKETIME={faketime_offset(seconds)} "
        f'"FAKETIME_SHARED={shared.env_value}"'
    )
    path.write_text(with_set_env(original, assignments))
    try:
        cluster.restart_sshd(node)
        _verify_shift(cluster, node, seconds)
        yield
    finally:
        path.write_text(original)
        cluster.restart_sshd(node)
        shared.remove()


def _verify_shift(cluster: Cluster, node: Node, seconds: float, attempts: int = 10) -> None:
    low = high = 0.0
    for _ in range(attempts):
        low, high = measured_shift(cluster, node)
        # The bounds are exact; they also prove a shift only when narrower than the shift.
        if low - 0.002 <= seconds <= high + 0.002 and high - low < max(abs(seconds) / 2, 0.005):
            return
    raise RuntimeError(
        f"the clock on {node.name} is not {seconds:+g} s off: "
        f"shift measured between {low:+.4f} and {high:+.4f} s"
    )


# ----- freezing ----------------------------------------------------------------------------


def freeze(pids: Iterable[int]) -> list[int]:
    """SIGSTOP each pid; returns those that were still there to stop."""
    return _signal_all(pids, signal.SIGSTOP)


def thaw(pids: Iterable[int]) -> list[int]:
    """SIGCONT each pid; returns those that were still there."""
    return _signal_all(pids, signal.SIGCONT)


def _signal_all(pids: Iterable[int], sig: int) -> list[int]:
    done = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
            done.append(pid)
    return done


@contextlib.contextmanager
def frozen(pids: Iterable[int]) -> Iterator[list[int]]:
    """Within the block, `pids` are stopped (SIGSTOP); SIGCONT after, whatever happens."""
    stopped = freeze(list(pids))
    try:
        yield stopped
    finally:
        thaw(stopped)


def is_agent(proc: Proc, run_id: str | None = None) -> bool:
    """Whether `proc` is an orchestrator node agent (of run `run_id`, when given).

    The agent runs `python -I -S -u -c BOOTSTRAP orchestrator-agent TAG`, exec'd by the
    login shell with ORCHESTRATOR_RUN_ID=TAG in its environment."""
    if AGENT_ARGV0 not in proc.cmdline or "-c" not in proc.cmdline:
        return False
    return run_id is None or proc.has_env("ORCHESTRATOR_RUN_ID", run_id)


def agent_pids(cluster: Cluster, node: Node, run_id: str | None = None) -> list[int]:
    """The pids of the agents on `node` (of run `run_id`, when given)."""
    return [p.pid for p in cluster.processes_on(node) if is_agent(p, run_id)]


def pids_but_sshd(cluster: Cluster, node: Node) -> list[int]:
    """Every process in `node`'s namespace except its sshd (listener and sessions)."""
    return [p.pid for p in cluster.processes_on(node, include_lab=True) if p.exe != SSHD]


def stall(pids: Iterable[int], seconds: float) -> None:
    """Stop `pids` for `seconds`, then let them go on."""
    with frozen(pids):
        time.sleep(seconds)


# ----- a slow CPU -------------------------------------------------------------------------

CGROUP_V2 = Path("/sys/fs/cgroup")
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000


def cpu_cgroup_root() -> Path | None:
    """Where a CPU-limited cgroup can be made here (v2 with the cpu controller, or v1's cpu
    hierarchy), or None."""
    if "cpu" in _read(CGROUP_V2 / "cgroup.controllers").split():
        return CGROUP_V2
    if (CGROUP_V1_CPU / "cpu.cfs_quota_us").exists():
        return CGROUP_V1_CPU
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@contextlib.contextmanager
def cpu_capped(pids: Iterable[int], share: float) -> Iterator[Path]:
    """Within the block, `pids` (and their threads) may use `share` of one core in all;
    after it, they go back to the root group, uncapped."""
    root = cpu_cgroup_root()
    if root is None:
        raise RuntimeError("no writable cgroup cpu controller on this machine")
    group = root / f"orchestrator-lab-{os.getpid()}-{time.monotonic_ns()}"
    group.mkdir()
    quota = max(1000, int(share * PERIOD_US))
    if root == CGROUP_V2:
        (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
    else:
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, OSError):
                (group / "cgroup.procs").write_text(str(pid))
        yield group
    finally:
        for pid in _read(group / "cgroup.procs").split():
            with contextlib.suppress(OSError):
                (root / "cgroup.procs").write_text(pid)
        with contextlib.suppress(OSError):
            group.rmdir()


# ----- power loss --------------------------------------------------------------------------


def power_off(cluster: Cluster, node: Node, rounds: int = 20) -> int:
    """Switch `node` off: link down, then SIGKILL to every process in its namespace.

    Returns how many processes were killed. `power_on` brings the node back (link, sshd).
    """
    cluster.cut_link(node)
    killed = len(cluster.kill_sshd(node))  # the listener, recorded by the lab
    for _ in range(rounds):  # processes may fork while we kill
        pids = [p.pid for p in cluster.processes_on(node, include_lab=True)]
        if not pids:
            return killed
        killed += len(_signal_all(pids, signal.SIGKILL))
        time.sleep(0.05)
    left = [p.command[:80] for p in cluster.processes_on(node, include_lab=True)]
    raise RuntimeError(f"processes on {node.name} survive SIGKILL: {left}")


def power_on(cluster: Cluster, node: Node) -> None:
    """Bring a switched-off `node` back: link up, sshd started (its sessions are gone)."""
    cluster.restore_link(node)
    if cluster.sshd_pid(node) is None:
        cluster.start_sshd(node)


@contextlib.contextmanager
def powered_off(cluster: Cluster, node: Node) -> Iterator[None]:
    """Switch `node` off on entry and back on when the block ends."""
    try:
        power_off(cluster, node)
        yield
    finally:
        power_on(cluster, node)


def plain_home(path: Path) -> Path:
    """A home directory whose shell start-up files do nothing (for SetEnv HOME=...).

    Root's own ~/.bashrc may run tools such as pyenv on every SSH command; benchmarks at
    many nodes log in with this home instead (LAB.md, "Timing at many nodes")."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o755)
    for name in (".bashrc", ".profile", ".bash_profile"):
        (path / name).write_text("")
    return path


# ----- a small disk -------------------------------------------------------------------------


@contextlib.contextmanager
def small_disk(cluster: Cluster, node: Node, path: Path, size: str = "2m") -> Iterator[None]:
    """`path` on `node` is a tmpfs of `size` while the block runs (created if missing);
    the other nodes and the lab still see the folder beneath it."""
    pid = cluster.sshd_pid(node)
    assert pid is not None, f"{node.name}: sshd is not running"
    path.mkdir(parents=True, exist_ok=True)
    enter = ["nsenter", "-t", str(pid), "-m"]
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]
    subprocess.run([*enter, *mount], check=True, capture_output=True)
    try:
        yield
    finally:
        subprocess.run([*enter, "umount", "-l", str(path)], check=True, capture_output=True)
