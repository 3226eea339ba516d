"""Process control: the node script in a session of its own, and stopping all it started.

The agent becomes the child subreaper, so every process of the run stays its descendant
even when torchrun dies first; a stop is SIGTERM to every descendant and SIGKILL to what is
left after the grace. It only ever signals its own descendants: nothing else on the node.

Standard library only: this module runs on the nodes too (see orchestrator.agent.bootstrap).
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time

# Type names only (annotations are never evaluated here): importing typing would cost
# every agent a few ms of start-up on every node.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO

PR_SET_CHILD_SUBREAPER = 36
SCAN_S = 0.05  # how often a stop looks for processes left
# Whether this kernel lists each thread's children in /proc (CONFIG_PROC_CHILDREN, on in
# the common distributions' kernels); see descendants_of.
CHILDREN_FILES = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


class ProcessTree:
    """The node script and everything under it; `say` tells the controller about a stop."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.proc: subprocess.Popen | None = None
        self.script_rc: int | None = None
        self.stopping = False
        self.stop_deadline = 0.0
        self.killing = False
        self.signalled: set[int] = set()
        self.last_scan = 0.0

    def start(self, argv: list[str], cwd: str, env: dict[str, str]) -> subprocess.Popen:
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
        return self.proc

    def reap(self) -> None:
        """Collect every ended child (orphans included); note the script's exit code."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.proc is not None and pid == self.proc.pid:
                self.script_rc = os.waitstatus_to_exitcode(status)
                self.proc.returncode = self.script_rc

    def descendants(self) -> list[int]:
        return descendants_of(os.getpid())

    def begin_stop(self, grace: float, reason: str) -> None:
        """SIGTERM to everything now, SIGKILL after `grace`; a shorter grace wins."""
        deadline = time.monotonic() + grace
        if self.stopping and deadline >= self.stop_deadline:
            return
        first = not self.stopping
        self.stopping = True
        self.stop_deadline = deadline
        if first:
            pids = self.descendants()
            group = None
            if self.proc is not None and self.script_rc is None:
                group = self.proc.pid
                signal_group(group, signal.SIGTERM)
            for pid in pids:
                # Once each: a second SIGTERM that reaches torchrun while it stops its
                # workers cuts that stop short (a second SignalException, raised in
                # its wait for them) and leaves a chained traceback in the node log.
                if group is None or group_of(pid) != group:
                    signal_pid(pid, signal.SIGTERM)
            self.signalled.update(pids)
            if pids:
                self.say(
                    f"stopping ({reason}): SIGTERM to {len(pids)} process(es), "
                    f"SIGKILL after {grace:g} s"
                )
        self.last_scan = 0.0

    def enforce_stop(self, now: float, ranks_done: bool) -> None:
        """During a stop: SIGTERM to newcomers, SIGKILL to all once the grace is over."""
        if now - self.last_scan < SCAN_S:
            return
        self.last_scan = now
        pids = self.descendants()
        if not self.stopping:
            return
        if now >= self.stop_deadline:
            if pids and not self.killing:
                self.say(f"SIGKILL to {len(pids)} process(es) still running")
            self.killing = True
            for pid in pids:
                signal_pid(pid, signal.SIGKILL)
        else:
            for pid in set(pids) - self.signalled:  # started since the stop began
                signal_pid(pid, signal.SIGTERM)
            self.signalled.update(pids)
            if ranks_done and self.proc is not None and self.script_rc is None:
                # Every rank has ended. What is left of the node script is torchrun's own
                # exit (a traceback for the signal, then unloading torch: a second or more
                # of CPU per node), which the stop need not wait for.
                signal_pid(self.proc.pid, signal.SIGKILL)


def script_command(config: dict, node_dir: str | None) -> tuple[list[str], str, dict[str, str]]:
    """(argv, cwd, env) of the step: the node script written to `node_dir`, or a command."""
    env = dict(os.environ)
    # As if started by the login shell that ran the agent: its `exec` lowered SHLVL to
    # 0, and a `bash -c` seeing SHLVL 0 and SSH_CLIENT takes itself for sshd's session
    # shell and reads ~/.bashrc again, for every command and every rank (with pyenv or
    # conda in it, a second or more each). The session shell has read it already.
    env["SHLVL"] = str(max(1, shell_level(env)))
    env.update(config.get("env", {}))
    if node_dir:
        env["ORCHESTRATOR_NODE_DIR"] = node_dir
    if config.get("script") is None:
        return config["argv"], config.get("cwd") or node_dir or os.path.expanduser("~"), env
    assert node_dir is not None
    path = os.path.join(node_dir, config["script_name"])
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(config["script"])
    os.chmod(path, 0o755)
    return ["bash", path], node_dir, env


def own_pid(pid: int) -> int:
    """The pid the process sees itself as: in a container's pid namespace, not the host's
    (the last of /proc/PID/status's NSpid); `pid` itself where it has no namespace of its own."""
    found = status_fields(pid, "NSpid")
    try:
        return int(found["NSpid"].split()[-1]) if found and "NSpid" in found else pid
    except (ValueError, IndexError):
        return pid


def status_fields(pid: int, *names: str, task: int | str | None = None) -> dict[str, str] | None:
    """The lines `names` of /proc/PID/status (one thread's, /proc/PID/task/TASK/status, where
    `task` is given), each as the text after its colon; None if the process (or thread) is
    gone."""
    path = f"/proc/{pid}/status" if task is None else f"/proc/{pid}/task/{task}/status"
    found: dict[str, str] = {}
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key in names:
                    found[key] = value.strip()
    except OSError:
        return None
    return found


def claim_node_dir(node_dir: str) -> IO[str]:
    """Hold the node directory for this run (the returned lock, kept open for the run);
    clear what an earlier run of the same id left."""
    os.makedirs(node_dir, mode=0o700, exist_ok=True)
    lock = open(os.path.join(node_dir, ".agent.lock"), "w")  # noqa: SIM115
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise OSError(f"another run with the same run id is active in {node_dir}") from None
    for name in os.listdir(node_dir):
        if name.startswith(("rank-", "metrics-")):
            os.remove(os.path.join(node_dir, name))
    return lock


def descendants_of(root: int) -> list[int]:
    """Live (non-zombie) descendants of `root`.

    Walked down /proc/PID/task/TID/children, which reads only the run's own processes: a
    scan of all of /proc costs every agent a read per process of the machine, four times
    at the end of every step and every 50 ms of a stop (12 of the 112 ms of CPU a whole
    `exec` step cost on a machine with 70 processes). On a kernel without those files
    (CONFIG_PROC_CHILDREN unset), one scan of /proc.
    """
    if not CHILDREN_FILES:
        return scanned_descendants_of(root)
    return [pid for pid in tree_of(root) if state_of(pid) not in (None, b"Z", b"X")]


def children_of(pid: int) -> list[int]:
    """The children of every thread of `pid` (empty when it has gone)."""
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as handle:
                found.extend(int(word) for word in handle.read().split())
        except OSError:
            continue
    return found


def tree_of(root: int, children: Callable[[int], list[int]] = children_of) -> list[int]:
    """Every descendant of `root` (zombies included, from the children files by default)."""
    found, todo = [], [root]
    while todo:
        for child in children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def stat_fields(pid: int, task: int | None = None) -> list[bytes] | None:
    """/proc/PID/stat (one thread's, /proc/PID/task/TASK/stat, where `task` is given) from
    its third field on (the state letter: R, S, Z, ...), past the command name, which may
    hold spaces and parentheses; None if the process (or thread) is gone."""
    path = f"/proc/{pid}/stat" if task is None else f"/proc/{pid}/task/{task}/stat"
    try:
        with open(path, "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def state_of(pid: int) -> bytes | None:
    """A process's state letter (R, S, Z, ...); None if gone."""
    fields = stat_fields(pid)
    return fields[0] if fields else None


def scanned_descendants_of(root: int) -> list[int]:
    """Live (non-zombie) descendants of `root`, from one scan of /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        fields = stat_fields(int(name)) if name.isdigit() else None
        if fields is None or fields[0] in (b"Z", b"X"):
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    return tree_of(root, lambda pid: children.get(pid, []))


def signal_pid(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def group_of(pid: int) -> int | None:
    """A process's group, or None when it has ended."""
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def shell_level(env: dict[str, str]) -> int:
    """SHLVL (bash's nesting depth) of an environment; 0 when unset or not a number."""
    try:
        return int(env.get("SHLVL", "0"))
    except ValueError:
        return 0


def become_subreaper() -> None:
    """Orphans of the run re-parent to the agent instead of init, so none escape a stop."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass
