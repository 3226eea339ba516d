"""The node agent: runs on every node for the length of a run, standard library only.

The controller starts it with the node's interpreter (a local subprocess or an SSH exec
channel) through `BOOTSTRAP`, then sends this file's source and a JSON config over stdin.
The agent then:

- starts the node script (`bash nodeN.sh`) or a command in a session of its own, and
  becomes the child subreaper, so every process of the run stays its descendant even when
  torchrun dies first;
- streams each rank's output (from rank-N.out, written by the script's run_rank) as whole
  lines, the script's own output (torchrun's), and each rank's exit code and time;
- stops everything on `stop GRACE` (SIGTERM to every descendant, SIGKILL to what is left
  after GRACE seconds), at once on `kill`, and by itself when the controller goes away:
  stdin closes (controller killed, connection dropped) or no heartbeat for a while
  (network lost). It only ever signals its own descendants: nothing else on the node.

Frames to the controller (stdout): an ASCII header line `TYPE field...`, followed, for
types with a length field, by exactly that many payload bytes:
  S pid t            started           O rank n + data   rank output (whole lines)
  N n + data         script output     E rank rc t       a rank exited
  F rank n + data    rank error file   M n + data        a message from the agent
  H t                heartbeat         X rc t            finished; nothing follows
Commands from the controller (stdin lines): `hb`, `stop GRACE`, `kill`.

After X the agent waits (up to IDLE_S) for another step of the same run: a `next` line and
a length-prefixed config. So the launch's preflight probe and its job share one agent, and
one SSH session (one login shell), per node. It ends when stdin closes.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import time

# Run by the node's interpreter: read a length-prefixed source from stdin and execute it.
BOOTSTRAP = (
    "import os\n"
    "def read_exact(n):\n"
    "    data = b''\n"
    "    while len(data) < n:\n"
    "        chunk = os.read(0, n - len(data))\n"
    "        if not chunk:\n"
    "            raise SystemExit('orchestrator agent: the controller went away')\n"
    "        data += chunk\n"
    "    return data\n"
    "exec(compile(read_exact(int(read_exact(8))), 'orchestrator-agent', 'exec'))\n"
)


def agent_argv(python: str, tag: str) -> list[str]:
    """How a node's interpreter starts the agent.

    Isolated (-I: no PYTHON* variables, no user site) and without site (-S): the agent
    needs the standard library alone, and skipping site-packages and their .pth files
    saves CPU on every node at every start (45 -> 38 ms for a whole `exec` step in a
    venv with torch). The job's own processes get the environment as it is.
    """
    return [python, "-I", "-S", "-u", "-c", BOOTSTRAP, "orchestrator-agent", tag]


def encode_config(config: dict) -> bytes:
    return length_prefixed(json.dumps(config).encode())


def read_config() -> dict:
    return json.loads(read_exact(int(read_exact(8))))


READ_CHUNK = 1 << 20
MAX_PENDING_OUT = 8 << 20  # stop reading rank files while this much waits for the controller
MAX_LINE = 1 << 20  # a longer line without newline is passed on in pieces of this size
POLL_S = 0.02
HEARTBEAT_S = 1.0
IDLE_S = 30.0  # how long a finished agent waits for the controller's next step
PR_SET_CHILD_SUBREAPER = 36


def frame(kind: str, *fields: object, payload: bytes | None = None) -> bytes:
    """Encode one frame; `payload` adds its length as the last header field."""
    head = " ".join([kind, *(str(f) for f in fields)])
    if payload is None:
        return head.encode() + b"\n"
    return f"{head} {len(payload)}\n".encode() + payload


def length_prefixed(data: bytes) -> bytes:
    return b"%08d" % len(data) + data


def read_exact(n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            raise SystemExit("orchestrator agent: the controller went away")
        data += chunk
    return data


class RankFile:
    """Tail of one rank's output file, cut into whole lines."""

    def __init__(self, rank: int, path: str) -> None:
        self.rank = rank
        self.path = path
        self.fd: int | None = None
        self.partial = b""

    def read_lines(self, budget: int) -> bytes:
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return b""
        chunks = []
        while budget > 0:
            wanted = min(READ_CHUNK, budget)
            chunk = os.read(self.fd, wanted)
            if chunk:
                chunks.append(chunk)
                budget -= len(chunk)
            if len(chunk) < wanted:  # caught up with the rank: the next step reads on
                break
        if not chunks:
            return b""
        data = self.partial + b"".join(chunks)
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) >= MAX_LINE:
            cut = len(data)
        self.partial = data[cut:]
        return data[:cut]

    def at_end(self) -> bool:
        """Everything written so far has been read (or the file was never created)."""
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return True
        return os.lseek(self.fd, 0, os.SEEK_CUR) >= os.fstat(self.fd).st_size

    def rest(self) -> bytes:
        """The last line when the rank ended without a newline."""
        data, self.partial = self.partial, b""
        return data + b"\n" if data else b""


class Agent:
    def __init__(self, config: dict) -> None:
        self.config = config
        self.out = bytearray()
        self.stdout_open = True
        self.stdin_open = True
        self.inbuf = b""
        self.node_buf = b""
        self.proc: subprocess.Popen | None = None
        self.script_rc: int | None = None
        self.stopping = False
        self.stop_deadline = 0.0
        self.killing = False
        self.controller_silent = False
        self.signalled: set[int] = set()
        self.last_hb_in = time.monotonic()
        self.last_hb_out = 0.0
        self.last_scan = 0.0
        self.secrets = [s.encode() for s in config.get("secrets", []) if s]
        node_dir = config.get("node_dir")
        self.node_dir = os.path.expanduser(node_dir) if node_dir else None
        self.ranks = [RankFile(r, os.path.join(self.node_dir, f"rank-{r}.out"))
                      for r in config.get("ranks", [])] if self.node_dir else []
        self.exited_ranks: set[int] = set()

    # --- output to the controller ------------------------------------------------------

    def send(self, data: bytes) -> None:
        if self.stdout_open:
            self.out += data

    def message(self, text: str) -> None:
        self.send(frame("M", payload=self.mask(text.encode())))

    def mask(self, data: bytes) -> bytes:
        for secret in self.secrets:
            data = data.replace(secret, b"***")
        return data

    def flush(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while self.out and self.stdout_open:
            left = end - time.monotonic()
            if left <= 0:
                return
            _, writable, _ = select.select([], [1], [], left)
            if writable:
                self.write_some()

    def write_some(self) -> None:
        try:
            written = os.write(1, self.out[:READ_CHUNK])
        except BlockingIOError:
            return
        except OSError:  # the controller is gone; nobody to tell
            self.stdout_open = False
            self.out.clear()
            return
        del self.out[:written]

    # --- the run ------------------------------------------------------------------------

    def start(self) -> None:
        config = self.config
        env = dict(os.environ)
        # As if started by the login shell that ran the agent: its `exec` lowered SHLVL to
        # 0, and a `bash -c` seeing SHLVL 0 and SSH_CLIENT takes itself for sshd's session
        # shell and reads ~/.bashrc again, for every command and every rank (with pyenv or
        # conda in it, a second or more each). The session shell has read it already.
        env["SHLVL"] = str(max(1, shell_level(env)))
        env.update(config.get("env", {}))
        cwd = self.node_dir or os.path.expanduser("~")
        if self.node_dir:
            self.claim_node_dir()
            env["ORCHESTRATOR_NODE_DIR"] = self.node_dir
        if config.get("script") is not None:
            path = os.path.join(self.node_dir, config["script_name"])
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(config["script"])
            os.chmod(path, 0o755)
            argv = ["bash", path]
        else:
            argv = config["argv"]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            cwd=cwd, env=env, start_new_session=True,
        )
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.send(frame("S", self.proc.pid, f"{time.time():.6f}"))

    def claim_node_dir(self) -> None:
        """Hold the node directory for this run; clear what an earlier run of the same id left."""
        os.makedirs(self.node_dir, mode=0o700, exist_ok=True)
        self.lock = open(os.path.join(self.node_dir, ".agent.lock"), "w")  # noqa: SIM115
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OSError(f"another run with the same run id is active in {self.node_dir}") \
                from None
        for name in os.listdir(self.node_dir):
            if name.startswith("rank-"):
                os.remove(os.path.join(self.node_dir, name))

    def run(self) -> int:
        become_subreaper()
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        # A signal to the agent itself (e.g. the node shutting down) is an orderly stop.
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(signum, lambda *_: self.begin_stop(self.grace(), "agent signalled"))
        os.set_blocking(1, False)
        try:
            self.start()
        except OSError as exc:
            self.message(f"cannot start: {exc}")
            self.send(frame("X", 127, f"{time.time():.6f}"))
            self.flush(10)
            return 127
        while True:
            self.step()
            if self.finished():
                break
        self.drain_ranks()
        self.check_rank_exits()
        self.mask_rank_files()
        self.send(frame("X", self.script_rc, f"{time.time():.6f}"))
        self.flush(10 if self.stdin_open else 2)
        return 0

    def grace(self) -> float:
        return float(self.config.get("grace", 10))

    def may_wait_for_next(self) -> bool:
        """After run(): the controller got everything and is still there to send more."""
        return self.stdin_open and self.stdout_open and not self.out and \
            not self.controller_silent

    def step(self) -> None:
        readers = []
        if self.stdin_open:
            readers.append(0)
        if self.proc is not None and self.proc.stdout is not None:
            readers.append(self.proc.stdout.fileno())
        writers = [1] if self.out and self.stdout_open else []
        try:
            readable, writable, _ = select.select(readers, writers, [], POLL_S)
        except InterruptedError:
            return
        if 1 in writable:
            self.write_some()
        if 0 in readable:
            self.read_commands()
        if self.proc is not None and self.proc.stdout is not None and \
                self.proc.stdout.fileno() in readable:
            self.read_script_output()
        if len(self.out) < MAX_PENDING_OUT:
            budget = MAX_PENDING_OUT - len(self.out)
            for rank in self.ranks:
                self.send_output(rank.rank, rank.read_lines(budget // max(1, len(self.ranks))))
        self.check_rank_exits()
        self.reap()
        now = time.monotonic()
        if now - self.last_hb_out >= HEARTBEAT_S:
            self.last_hb_out = now
            self.send(frame("H", f"{time.time():.6f}"))
        timeout = float(self.config.get("heartbeat_timeout", 30))
        if timeout > 0 and now - self.last_hb_in > timeout and not self.stopping:
            self.controller_silent = True
            self.begin_stop(self.grace(), f"no word from the controller for {timeout:g} s")
        if self.stopping or self.script_rc is not None:
            self.enforce_stop(now)

    def finished(self) -> bool:
        if self.script_rc is None:
            return False
        alive = self.descendants()
        if alive and not self.stopping:
            self.begin_stop(self.grace(), f"{len(alive)} process(es) left running "
                            "after the node script ended")
        script_output_open = self.proc is not None and self.proc.stdout is not None
        return not alive and not script_output_open

    def drain_ranks(self) -> None:
        """Send what the ranks wrote last, in bounded pieces, then any unfinished line."""
        for rank in self.ranks:
            while data := rank.read_lines(MAX_PENDING_OUT):
                self.send_output(rank.rank, data)
                self.flush(10 if self.stdin_open else 2)
            self.send_output(rank.rank, rank.rest())

    def mask_rank_files(self) -> None:
        """The ranks' raw output stays on the node: never with a secret in clear."""
        if not self.secrets:
            return
        for rank in self.ranks:
            masked = rank.path + ".masking"
            try:
                with open(rank.path, "rb") as raw, open(masked, "wb") as out:
                    for line in raw:
                        out.write(self.mask(line))
                os.replace(masked, rank.path)
            except FileNotFoundError:  # a rank that never started
                pass

    def send_output(self, rank: int, data: bytes) -> None:
        if data:
            self.send(frame("O", rank, payload=self.mask(data)))

    def read_script_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            chunk = os.read(self.proc.stdout.fileno(), READ_CHUNK)
        except BlockingIOError:
            return
        if not chunk:  # the script and everything holding its stdout are done
            self.proc.stdout.close()
            self.proc.stdout = None
            chunk = b"\n" if self.node_buf else b""
        data = self.node_buf + chunk
        cut = data.rfind(b"\n") + 1
        self.node_buf = data[cut:]
        if cut:
            self.send(frame("N", payload=self.mask(data[:cut])))

    def check_rank_exits(self) -> None:
        if not self.node_dir:
            return
        for rank in self.ranks:
            if rank.rank in self.exited_ranks:
                continue
            path = os.path.join(self.node_dir, f"rank-{rank.rank}.exit")
            try:
                with open(path, encoding="utf-8") as handle:
                    text = handle.read()
            except FileNotFoundError:
                continue
            if not text.endswith("\n"):  # still being written
                continue
            rc, when, *error_file = text.strip().split(" ", 2)
            # The rank has ended; report it once all its output is on the way.
            if not rank.at_end():
                continue
            self.send_output(rank.rank, rank.rest())
            self.exited_ranks.add(rank.rank)
            if error_file and os.path.isfile(error_file[0]):
                with open(error_file[0], "rb") as handle:
                    self.send(frame("F", rank.rank, payload=self.mask(handle.read(1 << 16))))
            self.send(frame("E", rank.rank, rc, when))

    def read_commands(self) -> None:
        try:
            chunk = os.read(0, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            self.stdin_open = False
            self.begin_stop(self.grace(), "the controller's connection closed")
            return
        self.last_hb_in = time.monotonic()
        self.inbuf += chunk
        *lines, self.inbuf = self.inbuf.split(b"\n")
        for line in lines:
            words = line.decode(errors="replace").split()
            if not words or words[0] == "hb":
                continue
            if words[0] == "stop":
                grace = float(words[1]) if len(words) > 1 else self.grace()
                self.begin_stop(grace, "stop requested")
            elif words[0] == "kill":
                self.begin_stop(0, "kill requested")

    # --- processes ----------------------------------------------------------------------

    def reap(self) -> None:
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
        deadline = time.monotonic() + grace
        if self.stopping and deadline >= self.stop_deadline:
            return
        first = not self.stopping
        self.stopping = True
        self.stop_deadline = deadline
        if first:
            pids = self.descendants()
            if self.proc is not None and self.script_rc is None:
                signal_group(self.proc.pid, signal.SIGTERM)
            for pid in pids:
                signal_pid(pid, signal.SIGTERM)
            self.signalled.update(pids)
            if pids:
                self.message(f"stopping ({reason}): SIGTERM to {len(pids)} process(es), "
                             f"SIGKILL after {grace:g} s")
        self.last_scan = 0.0

    def enforce_stop(self, now: float) -> None:
        if now - self.last_scan < 0.05:
            return
        self.last_scan = now
        pids = self.descendants()
        if not self.stopping:
            return
        if now >= self.stop_deadline:
            if pids and not self.killing:
                self.message(f"SIGKILL to {len(pids)} process(es) still running")
            self.killing = True
            for pid in pids:
                signal_pid(pid, signal.SIGKILL)
        else:
            for pid in set(pids) - self.signalled:  # started since the stop began
                signal_pid(pid, signal.SIGTERM)
            self.signalled.update(pids)
            if self.ranks and len(self.exited_ranks) == len(self.ranks) and \
                    self.proc is not None and self.script_rc is None:
                # Every rank has ended. What is left of the node script is torchrun's own
                # exit (a traceback for the signal, then unloading torch: a second or more
                # of CPU per node), which the stop need not wait for.
                signal_pid(self.proc.pid, signal.SIGKILL)


def descendants_of(root: int) -> list[int]:
    """Live (non-zombie) descendants of `root`, from one scan of /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if fields[0] in (b"Z", b"X"):
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def signal_pid(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


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


def next_config(idle_s: float) -> dict | None:
    """The config of the controller's next step, or None when stdin closes or none comes
    within `idle_s`. Lines before `next` were meant for the step that ended (a late `hb`)."""
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)  # nothing runs now: a signal just ends the agent
    deadline = time.monotonic() + idle_s
    line = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([0], [], [], left)[0]:
            return None
        try:
            byte = os.read(0, 1)
        except OSError:
            return None
        if not byte:
            return None
        if byte != b"\n":
            line += byte
        elif line == b"next":
            return read_config()
        else:
            line = b""


def main() -> int:
    config: dict | None = read_config()
    while True:
        agent = Agent(config)
        rc = agent.run()
        config = next_config(IDLE_S) if agent.may_wait_for_next() else None
        if config is None:
            return rc


if __name__ == "__main__":
    sys.exit(main())
