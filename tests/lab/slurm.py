"""A private SLURM cluster over the lab's namespace nodes: munged, slurmctld, one slurmd per node.

It leaves the machine's own SLURM and munge alone: every command and daemon reads
`SLURM_CONF=<workdir>/slurm/slurm.conf`, the controller port is private, and a private
munged serves `AuthInfo=socket=...`. slurmctld runs in the root namespace on the bridge
address; each slurmd runs inside its node's namespace.

Accounting: there is no slurmdbd, so `sacct` has no data ("Slurm accounting storage is
disabled"). Finished jobs stay visible to `scontrol show job` for MinJobAge seconds, and
`jobcomp/filetxt` appends one `key=value` line per finished job (JobState, ExitCode, ...)
to `jobcomp_path`, read by `SlurmCluster.jobcomp_records()`.
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.lab import state
from tests.lab.cluster import Cluster
from tests.lab.netns import Node
from tests.lab.packages import SLURM_PACKAGES, ensure_prerequisites

TERMINAL_STATES = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE",
}  # fmt: skip
SLURMD_PORT = 6818  # each slurmd is alone in its namespace, so the default port is free
CTLD_PORT_BASE = 18400  # + cluster index; checked free before use
MIN_JOB_AGE = 300
SLURMD_TIMEOUT = 10
URGENT_PARTITION = "urgent"  # its jobs preempt the default partition's
PREEMPT_GRACE_S = 20  # a preempted job's ranks have this long to save after the signal
# Labs running at once share one /tmp, where a node agent's socket is named by its job id:
# each lab numbers its jobs from its own block, so two labs' jobs never share an id.
JOB_IDS_PER_LAB = 100_000


def _free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket() as probe:
            try:
                probe.bind(("0.0.0.0", port))
            except OSError:
                continue
            return probe.getsockname()[1]
    raise RuntimeError("no free TCP port for slurmctld")


def _parse_pairs(text: str) -> dict[str, str]:
    """'A=1 B=x y C=2' (scontrol -o / jobcomp lines) -> dict; values may contain spaces."""
    pairs: dict[str, str] = {}
    key = None
    for token in text.split():
        name, sep, value = token.partition("=")
        if sep and name and (name[0].isupper() or name[0].isdigit() or "_" in name):
            key = name
            pairs[key] = value
        elif key is not None:
            pairs[key] += " " + token
    return pairs


class SlurmCluster:
    """SLURM over some nodes of a Cluster; build with `SlurmCluster.start(cluster)`."""

    def __init__(self, cluster: Cluster, nodes: tuple[Node, ...], cpus: int) -> None:
        self.cluster = cluster
        self.nodes = nodes
        self.cpus = cpus
        self.dir = cluster.workdir / "slurm"
        self.conf_path = self.dir / "slurm.conf"
        self.jobcomp_path = self.dir / "jobcomp.txt"
        self.munge_dir = self.dir / "munge"
        self.munge_socket = self.munge_dir / "munge.socket"
        self.ctld_port = _free_port(CTLD_PORT_BASE + cluster.state.index)
        self.partition = "debug"
        self._procs: list[subprocess.Popen[bytes]] = []

    @classmethod
    def start(
        cls,
        cluster: Cluster,
        nodes: Sequence[Node] | None = None,
        *,
        cpus: int | None = None,
        timeout: float = 30.0,
    ) -> SlurmCluster:
        """Start munged, slurmctld and the slurmds; return once every node is idle."""
        ensure_prerequisites(SLURM_PACKAGES)
        slurm = cls(cluster, tuple(nodes or cluster.nodes), cpus or os.cpu_count() or 1)
        try:
            slurm.dir.mkdir()
            slurm._start_munged()
            slurm._write_config()
            ctld = slurm._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(slurm.conf_path)])
            slurm._await_port(ctld, cluster.bridge_address, slurm.ctld_port, timeout)
            for node in slurm.nodes:
                argv = ["slurmd", "-D", "-N", node.name, "-f", str(slurm.conf_path)]
                slurm._spawn(f"slurmd {node.name}", ["ip", "netns", "exec", node.netns, *argv])
            slurm.wait_idle(timeout)
        except BaseException:
            slurm.stop()
            raise
        return slurm

    @property
    def env(self) -> dict[str, str]:
        """Variables SLURM commands and the CLI need: SLURM_CONF plus the cluster's ssh HOME."""
        return {**self.cluster.env, "SLURM_CONF": str(self.conf_path)}

    def environ(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """os.environ + `env` (+ `extra`), for subprocesses."""
        return self.cluster.environ({**self.env, **(extra or {})})

    # ----- daemons ------------------------------------------------------------------------

    def _start_munged(self) -> None:
        munge = pwd.getpwnam("munge")
        self.munge_dir.mkdir(mode=0o755)
        key = self.munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        for path in (self.munge_dir, key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        argv = [
            "/usr/sbin/munged", "--foreground", f"--socket={self.munge_socket}",
            f"--key-file={key}", f"--pid-file={self.munge_dir / 'munged.pid'}",
            f"--log-file={self.munge_dir / 'munged.log'}",
            f"--seed-file={self.munge_dir / 'munged.seed'}", "--num-threads=4",
        ]  # fmt: skip
        proc = self._spawn("munged", argv, user=munge.pw_uid, group=munge.pw_gid, extra_groups=[])
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                log = (self.munge_dir / "munged.log").read_text(errors="replace")
                raise RuntimeError(f"munged did not start (exit {proc.poll()}): {log[-800:]}")
            time.sleep(0.005)

    def _spawn(self, what: str, argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        log = open(self.dir / f"{what.replace(' ', '-')}.out", "ab")  # noqa: SIM115
        proc = subprocess.Popen(  # type: ignore[call-overload]
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "SLURM_CONF": str(self.conf_path)},
            **kwargs,
        )
        log.close()
        self._procs.append(proc)
        start = None
        while start is None and proc.poll() is None:
            start = state.process_start(proc.pid)
        self.cluster.state.pids.append([proc.pid, start or 0, what])
        self.cluster.state.save()
        return proc

    def _await_port(
        self, proc: subprocess.Popen[bytes], address: str, port: int, timeout: float
    ) -> None:
        # Polled here because sinfo, asked before slurmctld listens, sleeps a whole second.
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection((address, port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.01)
        raise RuntimeError(f"slurmctld not listening on {address}:{port}:{self._log_tails()}")

    def _log_tails(self) -> str:
        return "".join(
            f"\n--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
            for p in sorted(self.dir.glob("*.log")) + sorted(self.dir.glob("*.out"))
        )

    def _write_config(self) -> None:
        d = self.dir
        first, last = self.nodes[0].index, self.nodes[-1].index
        prefix = self.nodes[0].name.rsplit("node", 1)[0] + "node"
        names = f"{prefix}[{first}-{last}]" if len(self.nodes) > 1 else self.nodes[0].name
        if [n.index for n in self.nodes] != list(range(first, last + 1)):
            names = ",".join(n.name for n in self.nodes)
        lines = [
            f"ClusterName={self.cluster.name}",
            f"FirstJobId={1 + self.cluster.state.index * JOB_IDS_PER_LAB}",
            f"SlurmctldHost={socket.gethostname()}({self.cluster.bridge_address})",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={SLURMD_PORT}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire is also how long SLURM holds a requeued job back (120 s by default):
            # the requeue tests wait it out (forcing an earlier start races slurmd, which
            # refuses to relaunch a job within the second its old credential was revoked).
            f"AuthInfo=socket={self.munge_socket},cred_expire=20",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool-%n",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmdPidFile={d}/slurmd-%n.pid",
            f"SlurmctldLogFile={d}/slurmctld.log",
            f"SlurmdLogFile={d}/slurmd-%n.log",
            f"PlugStackConfig={d}/plugstack.conf",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "ReturnToService=2",
            # Accept CPUs= above what slurmd detects instead of draining the node.
            "SlurmdParameters=config_overrides",
            "SchedulerType=sched/backfill",
            # A job whose hold ends starts within seconds, not at the next minute's pass.
            "SchedulerParameters=sched_interval=2,bf_interval=2",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={self.jobcomp_path}",
            f"MinJobAge={MIN_JOB_AGE}",
            "KillWait=5",
            "InactiveLimit=0",
            "MessageTimeout=10",
            # A switched-off node (power_off) is DOWN, and its jobs NODE_FAIL, this many
            # seconds after its slurmd last answered, instead of the default 300.
            f"SlurmdTimeout={SLURMD_TIMEOUT}",
            # Preemption: a job of the `urgent` partition (PriorityTier 10) takes nodes from
            # a job of the default one, which SLURM requeues (it is requeueable unless it
            # asked --no-requeue) after a grace time; the job's --signal comes at once.
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
            "SlurmctldParameters=preempt_send_user_signal",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
        ]
        lines += [
            f"NodeName={n.name} NodeAddr={n.address} CPUs={self.cpus} State=UNKNOWN"
            for n in self.nodes
        ]
        lines += [
            f"PartitionName={self.partition} Nodes={names} Default=YES MaxTime=INFINITE "
            f"State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime={PREEMPT_GRACE_S}",
            f"PartitionName={URGENT_PARTITION} Nodes={names} MaxTime=INFINITE State=UP "
            "PriorityTier=10 PreemptMode=OFF",
        ]
        (d / "state").mkdir()
        (d / "plugstack.conf").write_text("")
        self.conf_path.write_text("\n".join(lines) + "\n")
        # slurmd refuses to start ("No filesystem mounted on /sys/fs/cgroup") without this.
        (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n")

    def stop(self) -> None:
        """Stop the slurmds, slurmctld and munged (job processes die with the cluster)."""
        mine = {p.pid for p in self._procs}
        for pid, start, _what in reversed([p for p in self.cluster.state.pids if p[0] in mine]):
            state.kill_recorded(int(pid), int(start))
        self.cluster.state.pids = [p for p in self.cluster.state.pids if p[0] not in mine]
        self.cluster.state.save()
        for proc in self._procs:
            proc.wait(timeout=10)
        self._procs.clear()

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----- a node switched off ------------------------------------------------------------

    def power_off(self, node: Node) -> None:
        """Link down, then SIGKILL to every process of `node`, its slurmd included: SLURM
        marks it DOWN (and ends its jobs NODE_FAIL) after SlurmdTimeout."""
        self.cluster.power_off(node)

    def power_on(self, node: Node, timeout: float = 60.0) -> None:
        """Bring `node` back: link and sshd up, its slurmd started again; returns once
        SLURM has it idle again (ReturnToService=2 takes it back when slurmd registers)."""
        self.cluster.power_on(node)
        argv = ["slurmd", "-D", "-N", node.name, "-f", str(self.conf_path)]
        self._spawn(f"slurmd {node.name}", ["ip", "netns", "exec", node.netns, *argv])
        deadline = time.monotonic() + timeout
        while self.node_states().get(node.name) != "idle" and time.monotonic() < deadline:
            if "down" in self.node_states().get(node.name, ""):
                self.run(["scontrol", "update", f"NodeName={node.name}", "State=RESUME"], False)
            time.sleep(0.5)
        self.wait_idle(timeout=5)

    # ----- commands -----------------------------------------------------------------------

    def run(
        self, argv: Sequence[str], check: bool = True, **kwargs: object
    ) -> subprocess.CompletedProcess[str]:
        """Run a SLURM command (sbatch, squeue, ...) from the controller with this cluster's env."""
        return subprocess.run(  # type: ignore[call-overload]
            list(argv), env=self.environ(), capture_output=True, text=True, check=check, **kwargs
        )

    def node_states(self) -> dict[str, str]:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until every node reports idle; raises with the states and daemon logs if not."""
        deadline = time.monotonic() + timeout
        names = {n.name for n in self.nodes}
        while True:
            states = self.node_states()
            if names <= states.keys() and all(states[n] == "idle" for n in names):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"SLURM nodes not idle after {timeout}s: {states}{self._log_tails()}"
                )
            time.sleep(0.1)

    def sbatch(self, script: str | Path, *args: str, cwd: Path | None = None) -> int:
        """Submit `script` (a path, or the script's text); returns the job id."""
        argv = ["sbatch", "--parsable", *args]
        text = None
        if isinstance(script, Path):
            argv.append(str(script))
        else:
            text = script
        done = self.run(argv, input=text, cwd=cwd)
        return int(done.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str] | None:
        """`scontrol show job` as a dict (JobState, ExitCode, NodeList, ...), None if unknown."""
        done = self.run(["scontrol", "-o", "show", "job", str(job_id)], check=False)
        return _parse_pairs(done.stdout) if done.returncode == 0 and done.stdout.strip() else None

    def wait_job(self, job_id: int, timeout: float = 120.0) -> dict[str, str]:
        """Wait until the job reaches a terminal state; returns its scontrol record."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info and info.get("JobState") in TERMINAL_STATES:
                return info
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} not finished after {timeout}s: {info}")
            time.sleep(0.2)

    def jobcomp_records(self) -> list[dict[str, str]]:
        """Finished jobs from the jobcomp/filetxt log (JobId, JobState, ExitCode, NodeList...)."""
        if not self.jobcomp_path.exists():
            return []
        return [_parse_pairs(line) for line in self.jobcomp_path.read_text().splitlines() if line]


@contextmanager
def make_slurm(cluster: Cluster, nodes: Sequence[Node] | None = None) -> Iterator[SlurmCluster]:
    """SLURM over `cluster` (all nodes by default) for the duration of the block."""
    slurm = SlurmCluster.start(cluster, nodes)
    try:
        yield slurm
    finally:
        slurm.stop()
