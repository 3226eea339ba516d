"""What the cluster benchmarks share: the namespace cluster, timing helpers, the table.

The nodes are network namespaces of this machine (tests/lab): they share its file system,
its clock and its pid namespace, so a remote process can time-stamp its own start into a
shared file, and the process table shows every process of a run on every node. Each
benchmark runs its contenders interleaved (one repetition of each, then the next), so a
change in the machine's load hits them alike, and prints medians and ratios of the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the lab lives in tests/lab

PYTHON = sys.executable  # the nodes run this interpreter too (they share the file system)
ORCHESTRATOR = [PYTHON, "-m", "orchestrator"]
INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")


def int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parser(description: str, nodes: str, repeat: int) -> argparse.ArgumentParser:
    args = argparse.ArgumentParser(description=description)
    args.add_argument(
        "--nodes",
        type=int_list,
        default=int_list(nodes),
        metavar="N,N,...",
        help=f"node counts (default {nodes})",
    )
    args.add_argument(
        "--repeat",
        type=int,
        default=repeat,
        metavar="N",
        help=f"repetitions of every contender per node count (default {repeat})",
    )
    return args


@contextlib.contextmanager
def inotify_room(nodes: int) -> Iterator[None]:
    """Room for one inotify instance per simulated node, for as long as they run.

    An agent watches its node directory with inotify (orchestrator/agent/wakeup.py) and
    falls back to polling, ten wake-ups a second, where the kernel gives it none. A real node
    has its own per-user limit (fs.inotify.max_user_instances, 128 by default), but the
    nodes simulated here all run as this machine's one user: past the limit, the later
    agents would poll, and at 512 nodes that polling took 0.22 % of a core per agent instead
    of 0.05 %. Raised by `nodes` (and restored after) where this process may (root); else
    said, since the figures would hold that polling."""
    try:
        before = int(INOTIFY_INSTANCES.read_text())
    except (OSError, ValueError):
        yield  # not Linux: the agents poll everywhere, as they would on such a node
        return
    wanted = before + nodes
    try:
        INOTIFY_INSTANCES.write_text(f"{wanted}\n")
    except OSError:
        if nodes + 16 > before:  # some left for the machine's other watchers
            say(
                f"note: {INOTIFY_INSTANCES} is {before} and cannot be raised here; agents past"
                " it poll (10 wake-ups a second), which real nodes, each with its own limit, do not"
            )
        yield
        return
    try:
        yield
    finally:
        INOTIFY_INSTANCES.write_text(f"{before}\n")


@contextlib.contextmanager
def lab_cluster(
    n: int, plain_home: Path | None = None, apart: bool = False, beside: int = 0
) -> Iterator[object]:
    """A namespace cluster of `n` nodes with sshd (tests.lab), torn down afterwards; with
    `plain_home`, the nodes' login shells start there, with empty start-up files (LAB.md,
    "Timing at many nodes": root's own ~/.bashrc may run pyenv on every SSH command).
    With `apart`, every node but the first `beside` (a jump host) runs in a cgroup of its
    own, as on a real cluster, where the nodes' work does not take the controller's CPU and
    memory (tests/lab/cgroups.py: at 250 nodes the controller was swapped out for minutes),
    and the nodes keep one copy of their identical pages (tests/lab/pages.py: 256 torchruns
    need 37 GB of their own). The baselines (pdsh, ssh) run beside the controller, outside
    the cgroup, on the same nodes."""
    from tests.lab import LabUnavailable, make_cluster
    from tests.lab.bad_days import plain_home as make_plain

    extra = f"SetEnv HOME={make_plain(plain_home)}" if plain_home is not None else ""
    try:
        with inotify_room(n), make_cluster(n, sshd_extra=extra, share_pages=apart) as cluster:
            if apart:
                say(cluster.confine(cluster.nodes[beside:]))
                say(cluster.sharing)
            yield cluster
    except LabUnavailable as exc:
        raise SystemExit(f"cannot build the namespace cluster here: {exc}") from None


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A temporary directory every node can read and write (they share this file system)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def remove_node_dirs(run_ids: Sequence[str]) -> None:
    """Delete what runs left in the nodes' home (the lab's nodes log in as root)."""
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    for run_id in run_ids:
        shutil.rmtree(home / ".orchestrator" / "runs" / run_id, ignore_errors=True)


def read_stamps(path: Path) -> dict[str, float]:
    """`KEY TIME` lines -> {KEY: earliest TIME}."""
    stamps: dict[str, float] = {}
    if not path.exists():
        return stamps
    for line in path.read_text().splitlines():
        key, _, when = line.rpartition(" ")
        if key and when:
            stamps[key] = min(float(when), stamps.get(key, float("inf")))
    return stamps


def wait_until(
    predicate: Callable[[], object], timeout: float, what: str, poll: float = 0.01
) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")


def run_command(
    argv: Sequence[str], env: dict[str, str], cwd: Path | None = None, timeout: float = 300
) -> tuple[float, float, subprocess.CompletedProcess]:
    """Run argv to its end, output discarded (stderr kept); (wall start, wall end, result)."""
    start = time.time()
    done = subprocess.run(
        list(argv),
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=timeout,
    )
    return start, time.time(), done


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float]) -> str:
    """'median (min-max)' in seconds, or '-' when nothing was measured."""
    if not values:
        return "-"
    return f"{median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def ratio(a: Sequence[float], b: Sequence[float]) -> str:
    if not a or not b or median(b) == 0:
        return "-"
    return f"{median(a) / median(b):.2f}x"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def machine_line() -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"machine: {os.cpu_count()} cores, load average {load} at start"


def say(text: str) -> None:
    print(text, flush=True)


def pdsh_environ(cluster, config: object | None = None) -> dict[str, str]:
    """The cluster's environment for pdsh, its ssh reading `config` (the lab's by default)."""
    config = cluster.ssh.config_path if config is None else config
    return {**cluster.environ(), "PDSH_SSH_ARGS_APPEND": f"-F {config}"}


def node_rank_from_address(addresses: Sequence[str]) -> str:
    """Shell that sets $r to the node's index in `addresses`, found from the address the
    node was reached at ($SSH_CONNECTION's third field): pdsh runs one command everywhere."""
    cases = " ".join(f"{a}) r={i};;" for i, a in enumerate(addresses))
    return f"set -- $SSH_CONNECTION; case $3 in {cases} esac"


def torchrun_on_each_node(addresses: Sequence[str], work: Path, program: str, port: int) -> str:
    """The command pdsh runs on every node: torchrun, one rank, its node rank found from
    the address the node was reached at ($SSH_CONNECTION's third field)."""
    torchrun = shlex.join(
        [
            PYTHON,
            "-m",
            "torch.distributed.run",
            f"--nnodes={len(addresses)}",
            "--nproc_per_node=1",
            f"--master_addr={addresses[0]}",
            f"--master_port={port}",
        ]
    )
    return (
        f"{node_rank_from_address(addresses)}; "
        f"cd {shlex.quote(str(work))} && exec {torchrun} --node_rank=$r {shlex.quote(program)}"
    )


TICK = os.sysconf("SC_CLK_TCK")
SLEEPING = "import time; print('sleeping', flush=True); time.sleep({seconds})\n"


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process, all its threads (its waited-for children not
    included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's ended children and their descendants
    (a command run to its end: the controller, or pdsh or a loop with their ssh processes)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def telling(lines: list[str], most: int = 40) -> str:
    """The lines that say why a run ended: the first `most` of them, leaving out the
    lines each node says when the run's stop reaches it, then the last few (the verdict)."""
    said = [line for line in lines if "(stop requested)" not in line]
    return "".join(said[:most] + (["...\n"] + said[-5:] if len(said) > most else []))


@contextlib.contextmanager
def sleeping_job(
    cluster, work: Path, seconds: float, run_id: str = "idle", timeout: float = 1800
) -> Iterator[subprocess.Popen]:
    """`orchestrator launch` of a job whose one rank per node prints `sleeping` and sleeps
    `seconds`: yields the controller's process once every rank has printed (every node
    runs), and stops it afterwards."""
    (work / "job.py").write_text(SLEEPING.format(seconds=seconds))
    hostfile = cluster.write_hostfile(work / "hosts.txt", slots=1)
    argv = [*ORCHESTRATOR, "launch", str(hostfile), "--run-dir", str(work / "runs")]
    argv += ["--run-id", run_id, "--color", "never", "--no-fold", "--", "job.py"]
    controller = subprocess.Popen(
        argv,
        cwd=work,
        env=cluster.environ(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        seen, deadline, said = 0, time.monotonic() + timeout, []
        while seen < len(cluster.nodes):
            line = controller.stdout.readline()
            if "sleeping" not in line:
                said.append(line)
            if not line or time.monotonic() > deadline:
                raise SystemExit(
                    f"the launch ended early or hung ({controller.poll()}):\n{telling(said)}"
                )
            seen += "sleeping" in line
        time.sleep(2)
        yield controller
    finally:
        controller.terminate()
        try:
            controller.wait(timeout=120)
        except subprocess.TimeoutExpired:
            controller.kill()
        remove_node_dirs([run_id])
