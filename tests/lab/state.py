"""What a lab cluster created, on disk, so that a later run can remove clusters whose owner died.

Every cluster records, before creating anything, an entry under LAB_RUN_DIR naming its
namespaces, links, /etc/hosts block, work directory and the pids (with start times, so a
reused pid is never killed) of the daemons it started. Subnet allocation happens under a
machine-wide lock so that two concurrent creators never pick the same subnet.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.lab import limits, pages
from tests.lab.cgroups import remove_dirs

LAB_RUN_DIR = Path("/run/orchestrator-lab")
HOSTS_FILE = Path("/etc/hosts")
# Cluster k (0..127) owns 10.177.2k.0/23 (510 addresses, room for a 256-node cluster and its
# jump host); the bridge is its first address, node i the (2 + i)th.
SUBNET_BASE = ipaddress.IPv4Network("10.177.0.0/16")
PREFIX = 23
MAX_CLUSTERS = 2 ** (PREFIX - SUBNET_BASE.prefixlen)
NAME_PREFIX = "olab"


@dataclass
class ClusterState:
    """The on-disk record of one cluster; written before each thing it names is created."""

    name: str
    index: int
    owner_pid: int
    owner_start: int
    bridge: str
    workdir: str = ""
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    # [pid, start time in clock ticks, what] for every daemon started.
    pids: list[list[int | str]] = field(default_factory=list)
    hosts_block: bool = False
    # `ip rule` arguments added in the root namespace (fault injection from the controller).
    root_rules: list[list[str]] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)  # the nodes' own, where confined
    ksm: dict[str, str] = field(default_factory=dict)  # ksmd's settings before, where shared
    inotify_instances: int = 0  # the user's inotify limit before, where raised (limits.py)

    @property
    def path(self) -> Path:
        return LAB_RUN_DIR / f"{self.name}.json"

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, self.path)

    @classmethod
    def load(cls, path: Path) -> ClusterState:
        return cls(**json.loads(path.read_text()))

    def owner_alive(self) -> bool:
        return process_start(self.owner_pid) == self.owner_start


def subnet_of(index: int) -> ipaddress.IPv4Network:
    """The subnet (a /PREFIX) owned by cluster `index`."""
    return list(SUBNET_BASE.subnets(new_prefix=PREFIX))[index]


def process_start(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot, or None if it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def kill_recorded(pid: int, start: int, timeout: float = 5.0) -> None:
    """SIGTERM then SIGKILL `pid`, but only while it is still the process started at `start`."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, timeout)):
        if process_start(pid) != start:
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and process_start(pid) == start:
            time.sleep(0.02)


@contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """An exclusive flock under LAB_RUN_DIR, shared by every process on this machine."""
    LAB_RUN_DIR.mkdir(parents=True, exist_ok=True)
    with open(LAB_RUN_DIR / name, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _ip(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _subnet_in_use(net: ipaddress.IPv4Network, bridge: str) -> bool:
    """True when the root namespace already routes `net` or has a link named `bridge`."""
    if _ip("link", "show", bridge).returncode == 0:
        return True
    routes = _ip("-4", "route", "show", "table", "all").stdout.split("\n")
    for line in routes:
        dest = line.split(" ", 1)[0]
        if dest in ("", "default", "local", "broadcast", "unreachable", "prohibit", "blackhole"):
            continue
        try:
            if ipaddress.IPv4Network(dest, strict=False).overlaps(net):
                return True
        except ValueError:
            continue
    return False


def allocate() -> ClusterState:
    """Claim a free cluster index (and so its subnet and names) for this process.

    Indices rotate (the next search starts after the last one handed out), so a name is not
    reused right after its cluster went away, which keeps "is it gone?" checks unambiguous.
    A stale cluster (owner dead) is reclaimed only when no never-used index is left.
    """
    me = os.getpid()
    with machine_lock("alloc.lock"):
        counter = LAB_RUN_DIR / "next-index"
        try:
            first = int(counter.read_text()) % MAX_CLUSTERS
        except (FileNotFoundError, ValueError):
            first = 0
        order = [(first + k) % MAX_CLUSTERS for k in range(MAX_CLUSTERS)]
        for reclaim in (False, True):
            for index in order:
                name = f"{NAME_PREFIX}{index}"
                path = LAB_RUN_DIR / f"{name}.json"
                if path.exists():
                    if not reclaim:
                        continue
                    try:
                        old = ClusterState.load(path)
                    except (ValueError, TypeError):
                        continue  # half-written by someone else right now, or foreign
                    if old.owner_alive():
                        continue
                    remove(old)
                bridge = f"{name}br"
                if _subnet_in_use(subnet_of(index), bridge):
                    continue
                state = ClusterState(name, index, me, process_start(me) or 0, bridge)
                state.save()
                counter.write_text(str(index + 1))
                return state
    raise RuntimeError(f"all {MAX_CLUSTERS} lab subnets of {SUBNET_BASE} are in use")


def _rule_into(line: str, net: ipaddress.IPv4Network) -> bool:
    """Whether an `ip rule show` line's destination (`... to 10.177.0.5 ...`) lies in `net`."""
    words = line.split()
    if "to" not in words[:-1]:
        return False
    try:
        return ipaddress.ip_network(words[words.index("to") + 1], strict=False).subnet_of(net)
    except (ValueError, TypeError):
        return False


def _hosts_markers(name: str) -> tuple[str, str]:
    return f"# >>> orchestrator-lab {name} >>>", f"# <<< orchestrator-lab {name} <<<"


def _rewrite_hosts(name: str, lines: list[str]) -> None:
    begin, end = _hosts_markers(name)
    with machine_lock("hosts.lock"):
        text = HOSTS_FILE.read_text()
        kept: list[str] = []
        inside = False
        for line in text.splitlines():
            if line == begin:
                inside = True
            elif line == end and inside:
                inside = False
            elif not inside:
                kept.append(line)
        if lines:
            kept += [begin, *lines, end]
        content = "\n".join(kept) + "\n"
        tmp = HOSTS_FILE.with_name(f".hosts.orchestrator-lab.{os.getpid()}")
        try:
            tmp.write_text(content)
            shutil.copystat(HOSTS_FILE, tmp)
            os.replace(tmp, HOSTS_FILE)  # atomic: a crash never leaves a half-written file
        except OSError:
            # In containers /etc/hosts is a bind mount, which rename cannot replace.
            tmp.unlink(missing_ok=True)
            with open(HOSTS_FILE, "r+") as handle:
                handle.write(content)
                handle.truncate()


def add_hosts_block(state: ClusterState, entries: list[tuple[str, str]]) -> None:
    """Add `address name` lines for this cluster in a marked /etc/hosts block."""
    state.hosts_block = True
    state.save()
    _rewrite_hosts(state.name, [f"{addr} {host}" for addr, host in entries])


def netns_inode(netns: str) -> int | None:
    try:
        return os.stat(f"/run/netns/{netns}").st_ino
    except FileNotFoundError:
        return None


def pids_in_netns(inode: int) -> list[int]:
    """Live (non-zombie) processes whose network namespace has this inode."""
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}/ns/net").st_ino == inode:
                found.append(int(entry))
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return [p for p in found if process_start(p) is not None]


def ksm_before(name: str) -> dict[str, str] | None:
    """ksmd's settings from before merging was turned on, as another recorded cluster that
    still has it on keeps them; None when no other has (then ours are the ones to restore)."""
    return _before(name, "ksm")


def inotify_before(name: str) -> int | None:
    """The inotify instance limit from before any recorded cluster raised it (as ksm_before)."""
    return _before(name, "inotify_instances")


def _before(name: str, setting: str):
    for path in sorted(LAB_RUN_DIR.glob(f"{NAME_PREFIX}*.json")):
        with contextlib.suppress(ValueError, TypeError, OSError):
            other = ClusterState.load(path)
            if other.name != name and getattr(other, setting):
                return getattr(other, setting)
    return None


def remove(state: ClusterState) -> list[str]:
    """Undo everything `state` records; returns descriptions of stray processes it had to kill."""
    strays: list[str] = []
    for pid, start, _what in reversed(state.pids):
        kill_recorded(int(pid), int(start))
    # Whatever still runs inside our namespaces (sessions, jobs) belongs to this cluster.
    # Sessions a client has just closed need a moment to exit by themselves.
    inodes = [i for i in map(netns_inode, state.namespaces) if i is not None]
    deadline = time.monotonic() + 0.5
    while any(pids_in_netns(i) for i in inodes) and time.monotonic() < deadline:
        time.sleep(0.02)
    for netns in state.namespaces:
        inode = netns_inode(netns)
        if inode is None:
            continue
        for stray in pids_in_netns(inode):
            started = process_start(stray)
            if started is None:
                continue
            try:
                cmd = Path(f"/proc/{stray}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                cmd = "?"
            strays.append(f"{netns}: pid {stray} {cmd.strip()}")
            kill_recorded(stray, started, timeout=2.0)
    remove_dirs([Path(path) for path in state.cgroups])
    if state.ksm and ksm_before(state.name) is None:
        pages.restore(state.ksm)
    if state.inotify_instances and inotify_before(state.name) is None:
        limits.restore(state.inotify_instances)
    for rule in state.root_rules:
        _ip("rule", "del", *rule)
    # Deleting the outer end removes the pair at once; `netns del` alone frees it lazily.
    for link in state.links:
        _ip("link", "del", link)
    for netns in state.namespaces:
        _ip("netns", "del", netns)
    _ip("link", "del", state.bridge)
    if state.hosts_block:
        _rewrite_hosts(state.name, [])
    if state.workdir and Path(state.workdir).is_dir():
        shutil.rmtree(state.workdir, ignore_errors=True)
    state.path.unlink(missing_ok=True)
    return strays


def remove_stale() -> list[str]:
    """Remove every recorded cluster whose owning process is gone; returns their names."""
    removed: list[str] = []
    for netns in _ip("netns", "list").stdout.split():
        # Namespaces of the prerequisite probe (packages.host_problems), if its process died.
        if netns.startswith(f"{NAME_PREFIX}-probe-") and not Path(f"/proc/{netns[11:]}").exists():
            _ip("netns", "del", netns)
    if not LAB_RUN_DIR.is_dir():
        return removed
    with machine_lock("alloc.lock"):
        for path in sorted(LAB_RUN_DIR.glob(f"{NAME_PREFIX}*.json")):
            try:
                state = ClusterState.load(path)
            except (ValueError, TypeError):
                continue
            if not state.owner_alive():
                remove(state)
                removed.append(state.name)
    return removed


def residue(record: ClusterState, netns_inodes: dict[str, int]) -> list[str]:
    """What of `record` still exists (empty after a clean teardown).

    `netns_inodes` maps namespace name -> inode, taken while the cluster was up, so processes
    still holding a deleted namespace are found too.
    """
    left: list[str] = []
    for ns in record.namespaces:
        inode = netns_inode(ns)
        if inode is not None and inode == netns_inodes.get(ns, inode):
            left.append(f"namespace {ns}")
    links = _ip("-o", "link", "show").stdout
    for link in [*record.links, record.bridge]:
        if f" {link}:" in links or f" {link}@" in links:
            left.append(f"link {link}")
    for pid, start, what in record.pids:
        if process_start(int(pid)) == int(start):
            left.append(f"process {pid} ({what})")
    for ns, inode in netns_inodes.items():
        left += [f"process {pid} in {ns}" for pid in pids_in_netns(inode)]
    begin, _end = _hosts_markers(record.name)
    if begin in HOSTS_FILE.read_text().splitlines():
        left.append("/etc/hosts block")
    rules = _ip("rule", "show").stdout
    net = subnet_of(record.index)
    left += [f"ip rule {line.strip()}" for line in rules.splitlines() if _rule_into(line, net)]
    left += [f"cgroup {path}" for path in record.cgroups if Path(path).is_dir()]
    if record.ksm and ksm_before(record.name) is None:
        now = pages.running()
        if now != record.ksm:
            left.append(f"ksmd settings {now} (were {record.ksm})")
    was, limit = record.inotify_instances, limits.current()
    if was and inotify_before(record.name) is None and limit != was:
        left.append(f"inotify instance limit {limit} (was {was})")
    if record.workdir and Path(record.workdir).exists():
        left.append(f"directory {record.workdir}")
    if record.path.exists():
        with contextlib.suppress(ValueError, TypeError, FileNotFoundError):
            current = ClusterState.load(record.path)
            if (current.owner_pid, current.owner_start) == (record.owner_pid, record.owner_start):
                left.append(f"state file {record.path}")
    return left
