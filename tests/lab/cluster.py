"""A cluster of network-namespace nodes on this machine, each with its own address and sshd.

The layout (names, addresses) is in netns.py; the on-disk record that makes stale clusters
removable is in state.py; network faults and the per-node process table are in faults.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path

from tests.lab import bad_days, faults, limits, netns, pages, state
from tests.lab.cgroups import Group, Unavailable
from tests.lab.netns import Node
from tests.lab.packages import SSH_PACKAGES, ensure_prerequisites
from tests.lab.ssh import SshHome, run_over_ssh, sshd_config

__all__ = ["Cluster", "Node", "make_cluster"]

SSHD = "/usr/sbin/sshd"


class Cluster:
    """A running namespace cluster; build it with `Cluster.create(n)` or `make_cluster(n)`."""

    def __init__(self, record: state.ClusterState, nodes: tuple[Node, ...], workdir: Path) -> None:
        self.state = record
        self.name = record.name
        self.subnet = state.subnet_of(record.index)
        self.bridge = record.bridge
        self.bridge_address = netns.bridge_address(record)
        self.controller_name = netns.controller_name(record)
        self.nodes = nodes
        self.workdir = workdir
        self.ssh = SshHome.create(workdir / "home")
        self.authorized_keys = workdir / "authorized_keys"
        self._sshd: dict[str, subprocess.Popen[bytes]] = {}
        self._sshd_extra = ""
        self.netns_inodes: dict[str, int] = {}
        self.apart: Group | None = None  # the confined nodes' cgroup (confine)
        self.confined: set[str] = set()
        self.sharing = "nodes keep their own copies of identical pages"  # (_share_pages)
        self.containers = False  # each sshd in a mount namespace with cgroup2 (create)

    # ----- construction and teardown -------------------------------------------------------

    @classmethod
    def create(
        cls,
        n: int,
        *,
        sshd_extra: str = "",
        install: bool = True,
        share_pages: bool = False,
        containers: bool = False,
    ) -> Cluster:
        """Bring up `n` nodes with sshd; raises LabUnavailable when this machine cannot.
        With `share_pages`, the nodes' identical memory pages are kept once (pages.py says
        why, at scale; `sharing` says whether it could be done). With `containers`, each
        node's sshd runs in a mount namespace of its own with a cgroup2 file system, which
        crun needs there (containers.py)."""
        if not 1 <= n <= netns.MAX_NODES:
            raise ValueError(f"a lab cluster has 1..{netns.MAX_NODES} nodes, not {n}")
        if install:
            ensure_prerequisites(SSH_PACKAGES)
        record = state.allocate()
        try:
            workdir = Path(tempfile.mkdtemp(prefix=f"orchestrator-lab-{record.name}-"))
            workdir.chmod(0o755)  # munged's socket path must be searchable by everyone
            record.workdir = str(workdir)
            record.save()
            cluster = cls(record, netns.plan_nodes(record, n, workdir), workdir)
            cluster.containers = containers
            if share_pages:
                sshd_extra = cluster._share_pages(sshd_extra)
            if (found := limits.raise_for(n)) is not None:  # one agent per node (limits.py)
                record.inotify_instances = state.inotify_before(record.name) or found
                record.save()
            cluster.netns_inodes = netns.build_network(record, cluster.nodes)
            cluster._start_all_sshd(sshd_extra)
            cluster.write_ssh_config()
            cluster.write_known_hosts()
        except BaseException:
            state.remove(record)
            raise
        return cluster

    @property
    def subnet_glob(self) -> str:
        """The cluster's addresses as ssh config `Host` patterns (`10.177.K.* 10.177.K+1.*`)."""
        blocks = self.subnet.subnets(new_prefix=24) if self.subnet.prefixlen < 24 else [self.subnet]
        return " ".join(str(block.network_address).rsplit(".", 1)[0] + ".*" for block in blocks)

    def _start_all_sshd(self, extra: str) -> None:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        self.authorized_keys.write_text(self.ssh.identity.public + " orchestrator-lab\n")
        self._sshd_extra = extra
        for node in self.nodes:
            self._write_sshd_config(node, extra)
        for node in self.nodes:
            self._spawn_sshd(node)
        for node in self.nodes:
            self._await_sshd(node)

    def _share_pages(self, sshd_extra: str) -> str:
        """Turn same-page merging on for this cluster's nodes (their sshds are spawned
        mergeable); returns the sshd config lines with the hash seed added."""
        try:
            found = pages.start()
        except pages.Unavailable as exc:
            self.sharing = f"nodes keep their own copies of identical pages ({exc})"
            return sshd_extra
        self.state.ksm = state.ksm_before(self.name) or found  # the settings before any cluster
        self.state.save()
        self.sharing = "nodes share identical memory pages (ASLR off, PYTHONHASHSEED=0, KSM)"
        return pages.with_hash_seed(sshd_extra)

    def confine(self, nodes: Sequence[Node] | None = None) -> str:
        """Put `nodes` (default: all) in a cgroup of their own, apart from the controller
        (cgroups.py says why, at scale); returns a line saying what was done, or why not."""
        chosen = list(self.nodes if nodes is None else nodes)
        try:
            if self.apart is None:
                self.apart = Group.create(f"{self.name}-nodes")
                self.state.cgroups = [str(path) for path in self.apart.dirs]
                self.state.save()
            for node in chosen:
                self.apart.add(self._sshd[node.name].pid)
                self.confined.add(node.name)
        except (Unavailable, OSError) as exc:
            return f"nodes share the controller's CPU and memory ({exc})"
        return f"{len(chosen)} nodes in a cgroup apart: their memory reclaimed first, one CPU share"

    def _write_sshd_config(self, node: Node, extra: str, stock_limits: bool = False) -> None:
        node.sshd_config_path.write_text(
            sshd_config(
                address=node.address,
                host_key=self.host_key_path(node),
                pid_file=node.sshd_pid_path,
                authorized_keys=self.authorized_keys,
                extra=extra,
                stock_limits=stock_limits,
            )
        )

    def use_stock_limits(self, node: Node | int | str, extra: str = "") -> None:
        """Restart `node`'s sshd with OpenSSH's default MaxStartups (10:30:100) and
        MaxSessions, as a login node nobody tuned (a jump host), or with `extra` lines
        (`MaxStartups 1`) in their place."""
        target = self._resolve(node)
        lines = f"{self._sshd_extra}\n{extra}".strip()
        self._write_sshd_config(target, lines, stock_limits=True)
        self.restart_sshd(target)

    def host_key_path(self, node: Node) -> Path:
        """The node's private host key (its `.pub` lies beside it)."""
        return node.dir / "ssh_host_ed25519_key"

    def present_host_certificate(self, node: Node | int | str, certificate: Path | None) -> None:
        """Restart `node`'s sshd so that it also presents `certificate` (made with
        `ssh-keygen -s`, see ssh.sign_host_key) for its host key; None: the plain key only."""
        target = self._resolve(node)
        extra = self._sshd_extra
        if certificate is not None:
            extra = f"{extra}\nHostCertificate {certificate}".strip()
        self._write_sshd_config(target, extra)
        self.restart_sshd(target)

    def _spawn_sshd(self, node: Node) -> None:
        node.sshd_pid_path.unlink(missing_ok=True)
        command = [SSHD, "-D", "-f", str(node.sshd_config_path), "-E", str(node.sshd_log_path)]
        if self.containers:  # `ip netns exec` mounts a /sys without /sys/fs/cgroup
            mount = 'mount -t cgroup2 none /sys/fs/cgroup && exec "$@"'
            command = ["unshare", "-m", "sh", "-c", mount, "sh", *command]
        if self.state.ksm:  # recorded only where merging was turned on (_share_pages)
            command = pages.mergeable(command)
        argv = ["ip", "netns", "exec", node.netns, *command]
        # `ip netns exec` (and the mergeable wrapper) exec sshd, so this pid is the
        # listener's; a new session keeps a terminal's Ctrl-C away from it (teardown stops it).
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # never hold the caller's pipes open (it logs via -E)
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._sshd[node.name] = proc
        if node.name in self.confined and self.apart is not None:
            self.apart.add(proc.pid)
        start = None
        while start is None and proc.poll() is None:
            start = state.process_start(proc.pid)
        self.state.pids.append([proc.pid, start or 0, f"sshd {node.name}"])
        self.state.save()

    def _await_sshd(self, node: Node, timeout: float = 10.0) -> None:
        # sshd writes its PidFile only after it listens, so the file means "ready".
        proc = self._sshd[node.name]
        deadline = time.monotonic() + timeout
        while not node.sshd_pid_path.exists() or not node.sshd_pid_path.read_text().strip():
            if proc.poll() is not None:
                log = node.sshd_log_path.read_text() if node.sshd_log_path.exists() else ""
                raise RuntimeError(f"sshd on {node.name} exited {proc.returncode}: {log.strip()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd on {node.name} not listening after {timeout}s")
            time.sleep(0.002)

    def teardown(self) -> list[str]:
        """Stop everything started, delete namespaces, links, hosts block and files.

        Returns 'netns: pid cmdline' for processes that were still running inside the nodes
        (sessions, jobs) and had to be killed.
        """
        strays = state.remove(self.state)
        for proc in self._sshd.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        return strays

    def residue(self) -> list[str]:
        """What of this cluster still exists; empty after a clean teardown."""
        return state.residue(self.state, self.netns_inodes)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    # ----- lookup, environment, files -----------------------------------------------------

    def node(self, key: int | str) -> Node:
        """The node with this index, name or address."""
        for node in self.nodes:
            if key in (node.index, node.name, node.address):
                return node
        raise KeyError(f"no node {key!r} in cluster {self.name}")

    @property
    def home(self) -> Path:
        return self.ssh.home

    @property
    def env(self) -> dict[str, str]:
        """Variables to set for a CLI subprocess so that paramiko uses the lab's ~/.ssh."""
        return {"HOME": str(self.home), "USER": "root", "LOGNAME": "root"}

    def environ(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The full environment for a subprocess: os.environ + `env` (+ `extra`), no agent."""
        merged = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
        return {**merged, **self.env, **(extra or {})}

    def write_hostfile(
        self, path: Path, nodes: Iterable[Node | int | str] | None = None, slots: int = 1
    ) -> Path:
        """Write `<name> slots=<slots>` lines for `nodes` (default: all) to `path`."""
        chosen = [self.node(n) if not isinstance(n, Node) else n for n in (nodes or self.nodes)]
        path.write_text("".join(f"{n.name} slots={slots}\n" for n in chosen))
        return path

    def write_known_hosts(
        self,
        nodes: Iterable[Node] | None = None,
        *,
        changed: Mapping[str, str] | None = None,
        path: Path | None = None,
    ) -> Path:
        """Rewrite ~/.ssh/known_hosts (or `path`) with `nodes`' real keys, `changed` overriding."""
        return self.ssh.write_known_hosts(
            self.nodes if nodes is None else nodes, changed=changed, path=path
        )

    def write_ssh_config(self, text: str | None = None) -> Path:
        """Replace ~/.ssh/config with `text`, or restore the default when None."""
        return self.ssh.write_config(
            text if text is not None else self.ssh.default_config(self.nodes, self.subnet_glob)
        )

    def ssh_argv(self, node: Node | int | str, *command: str) -> list[str]:
        """argv for OpenSSH's client to run `command` on `node` with the lab's config."""
        target = node if isinstance(node, Node) else self.node(node)
        return ["ssh", "-F", str(self.ssh.config_path), target.name, *command]

    def ssh_run(
        self, node: Node | int | str, command: str, timeout: float = 60.0
    ) -> tuple[int, str, str]:
        """Run `command` on `node` through paramiko; returns (exit status, stdout, stderr)."""
        target = node if isinstance(node, Node) else self.node(node)
        return run_over_ssh(
            target, command, self.ssh.key_path, self.ssh.known_hosts_path, timeout=timeout
        )

    def exec_in(
        self, node: Node | int | str, argv: Sequence[str], **kwargs: object
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` inside `node`'s namespace directly (no ssh), capturing text output."""
        target = node if isinstance(node, Node) else self.node(node)
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(["ip", "netns", "exec", target.netns, *argv], **kwargs)  # type: ignore[call-overload]

    def popen_in(
        self, node: Node | int | str, argv: Sequence[str], **kwargs: object
    ) -> subprocess.Popen[bytes]:
        """Start `argv` inside `node`'s namespace; the caller waits for or kills it.

        The pid is `argv`'s (ip execs it), but for a moment it still runs as `ip netns exec`.
        """
        target = node if isinstance(node, Node) else self.node(node)
        return subprocess.Popen(["ip", "netns", "exec", target.netns, *argv], **kwargs)  # type: ignore[call-overload]

    # ----- sshd faults ----------------------------------------------------------------------

    def sshd_pid(self, node: Node) -> int | None:
        """The pid of `node`'s sshd listener, or None when it is not running."""
        proc = self._sshd.get(node.name)
        return proc.pid if proc is not None and proc.poll() is None else None

    def kill_sshd(
        self, node: Node | int | str, *, sessions: bool = False, sig: int = signal.SIGKILL
    ) -> list[int]:
        """Kill `node`'s sshd listener (and with `sessions`, every sshd process on the node).

        Returns the pids signalled. Sessions' child processes (the commands) are left alone.
        """
        target = node if isinstance(node, Node) else self.node(node)
        killed: list[int] = []
        proc = self._sshd.get(target.name)
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(timeout=10)
            killed.append(proc.pid)
            self.state.pids = [p for p in self.state.pids if p[0] != proc.pid]
            self.state.save()
        if sessions:
            for found in faults.processes_in(target.netns, target.name):
                if found.exe == SSHD:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(found.pid, sig)
                    killed.append(found.pid)
        return killed

    def start_sshd(self, node: Node | int | str) -> int:
        """(Re)start `node`'s sshd with its original config and host key; returns its pid."""
        target = node if isinstance(node, Node) else self.node(node)
        if self.sshd_pid(target) is not None:
            raise RuntimeError(f"sshd on {target.name} is already running")
        self._spawn_sshd(target)
        self._await_sshd(target)
        return self._sshd[target.name].pid

    def restart_sshd(self, node: Node | int | str) -> int:
        """Kill and start `node`'s sshd listener (sessions survive); returns the new pid."""
        self.kill_sshd(node, sig=signal.SIGTERM)
        return self.start_sshd(node)

    # ----- network faults and process inspection (see faults.py) ----------------------------

    def cut_link(self, node: Node | int | str) -> None:
        """Take `node`'s outer veth down: the node drops off the network, processes keep running."""
        netns.set_link(self._resolve(node).veth, up=False)

    def restore_link(self, node: Node | int | str) -> None:
        """Bring `node`'s outer veth back up."""
        netns.set_link(self._resolve(node).veth, up=True)

    @contextlib.contextmanager
    def link_cut(self, node: Node | int | str) -> Iterator[None]:
        """Within the block, `node` is cut off."""
        self.cut_link(node)
        try:
            yield
        finally:
            self.restore_link(node)

    def block(
        self,
        src: Node | int | str | None,
        dst: Node | int | str,
        port: int | None = None,
        mode: str = "prohibit",
    ) -> faults.Block:
        """Block traffic from `src` (None: the controller) to `dst` (see faults.Block)."""
        source = None if src is None else self._resolve(src)
        return faults.add_block(self, source, self._resolve(dst), port, mode)

    def unblock(self, block: faults.Block) -> None:
        faults.remove_block(self, block)

    @contextlib.contextmanager
    def blocked(
        self,
        src: Node | int | str | None,
        dst: Node | int | str,
        port: int | None = None,
        mode: str = "prohibit",
    ) -> Iterator[faults.Block]:
        handle = self.block(src, dst, port, mode)
        try:
            yield handle
        finally:
            self.unblock(handle)

    def lab_pids(self) -> set[int]:
        """Pids of the daemons the lab itself started (sshd listeners, SLURM daemons)."""
        return {int(p[0]) for p in self.state.pids}

    def processes_on(self, node: Node | int | str, include_lab: bool = False) -> list[faults.Proc]:
        """Live processes inside `node`'s namespace (without the lab's daemons by default)."""
        target = self._resolve(node)
        found = faults.processes_in(target.netns, target.name)
        return found if include_lab else [p for p in found if p.pid not in self.lab_pids()]

    def processes_with_env(self, name: str, value: str | None = None) -> list[faults.Proc]:
        """Processes on any node whose environment has `name` (equal to `value` if given)."""
        return [p for node in self.nodes for p in self.processes_on(node) if p.has_env(name, value)]

    def pids_with_env(self, name: str, value: str | None = None) -> list[int]:
        return [p.pid for p in self.processes_with_env(name, value)]

    # ----- bad days: clock skew, power loss (see bad_days.py) -------------------------------

    def skew_clock(self, node: Node | int | str, seconds: float) -> ContextManager[None]:
        """Within the block, sessions started over SSH on `node` see a clock `seconds` off."""
        return bad_days.skew_clock(self, self._resolve(node), seconds)

    def power_off(self, node: Node | int | str) -> None:
        """Link down, then SIGKILL to every process of `node`, sshd included."""
        bad_days.power_off(self, self._resolve(node))

    def power_on(self, node: Node | int | str) -> None:
        bad_days.power_on(self, self._resolve(node))

    def _resolve(self, node: Node | int | str) -> Node:
        return node if isinstance(node, Node) else self.node(node)


@contextlib.contextmanager
def make_cluster(
    n: int, *, sshd_extra: str = "", share_pages: bool = False, containers: bool = False
) -> Iterator[Cluster]:
    """A cluster of `n` nodes for the duration of the block."""
    cluster = Cluster.create(
        n, sshd_extra=sshd_extra, share_pages=share_pages, containers=containers
    )
    try:
        yield cluster
    finally:
        cluster.teardown()
