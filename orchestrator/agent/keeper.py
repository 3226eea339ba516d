"""The node agent inside a SLURM allocation: the same agent, kept for whichever controller comes.

Under SLURM the job belongs to SLURM, not to a controller: the batch script starts, with one
srun task per node, an interpreter that reads this module, the agent's others and a config
from its stdin (`bootstrap.slurm_bundle`) and calls `main`. Here:

- The agent (main.Agent) runs in this process as over SSH, its stdin and stdout on two
  pipes instead of a connection, its step the node's part of the batch script
  (`bash -c orchestrator_node`): it ships the node's ranks' output, metrics and exits and
  samples the node, as over SSH. It never stops for want of a controller (heartbeat
  timeout 0): a job submitted by hand runs alone, and one whose controller died goes on.
- A relay thread keeps every byte the agent writes, numbered by its offset in the node's
  stream, up to KEPT_BYTES (then the oldest whole frames go), and listens on a Unix socket
  on the node (`socket_path`). A controller reaches it through SLURM (`srun --overlap
  --jobid JOB`, running DIAL on the node): it says from which offset it wants the stream,
  gets it from there and then live, and what it sends are the agent's commands (`stacks`,
  `stop`, `end`, `signal`). One controller at a time: a new connection replaces the old.
- Without a job folder (a script rendered for `sbatch` by hand), the script's own output
  (frames N) and the agent's messages (M) also go to this task's stdout and stderr, where
  SLURM puts them (slurm-JOB.out), as the script's output went before there was an agent.
- SLURM's warning (the time limit's or a preemption's, which srun passes to every process
  of the step) is held for the ranks still starting when it came: each gets it once it
  catches it (`hold`, limit_warning.HeldWarning).
- Once the agent has finished, what a connected controller has not yet taken is sent to it
  (up to DRAIN_S), and the task ends with the script's exit code, which srun reads; after
  the warning a nonzero one is kept in a file and the task ends 0 (`stopped_on_warning`),
  so that srun's --kill-on-bad-exit spares the nodes whose ranks still save.

Standard library only: this module runs on the nodes (see orchestrator.agent.bootstrap).
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import stat
import sys
import threading
import time
from collections import deque

from orchestrator.agent.limit_warning import HeldWarning, catching_now, rank_targets
from orchestrator.agent.main import Agent
from orchestrator.agent.protocol import WITH_PAYLOAD, Frame, frame, read_config

KEPT_BYTES = 64 << 20  # of the node's stream, for a controller that connects late
TRIM_STEP = 64 << 10  # what is dropped past KEPT_BYTES goes in whole frames of about this
DRAIN_S = 10.0  # after the step: how long a connected controller may take to read the rest
SEND_BYTES = 1 << 16
HELD_POLL_S = 0.1  # after the warning: how often ranks that ignored it are looked for
# The batch script hands the bundle to the interpreter from this variable; the step's
# processes do not need a copy of it in their environment.
CODE_ENV = "ORCHESTRATOR_AGENT_CODE"
PAYLOAD_KINDS = frozenset(kind.value for kind in WITH_PAYLOAD)

# Run on the node by the controller's `srun --overlap` (python -I -S -c DIAL PATH OFFSET
# WAIT): connect to the keeper's socket (waiting up to WAIT seconds for it to appear), ask
# for the stream from OFFSET, then carry bytes both ways until either side closes. The
# keeper's first line says where the stream starts (`at OFFSET LOST`).
DIAL = """\
import os, select, socket, sys, time
path, offset, wait = sys.argv[1], sys.argv[2], float(sys.argv[3])
deadline = time.monotonic() + wait
while True:
    try:
        st = os.stat(os.path.dirname(path))
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            sys.exit("%s is not a folder of this user's alone" % os.path.dirname(path))
    except FileNotFoundError:
        pass
    conn = socket.socket(socket.AF_UNIX)
    try:
        conn.connect(path)
        break
    except OSError as exc:
        conn.close()
        if time.monotonic() > deadline:
            sys.exit("no node agent at %s on this node: %s" % (path, exc.strerror))
        time.sleep(0.2)
conn.sendall(b"from " + offset.encode() + b"\\n")
while True:
    ready = select.select([0, conn], [], [])[0]
    if 0 in ready:
        data = os.read(0, 65536)
        if not data:
            break
        conn.sendall(data)
    if conn in ready:
        data = conn.recv(1 << 20)
        if not data:
            break
        while data:
            data = data[os.write(1, data):]
"""


def socket_path(
    job_id: str | int, restart: str | int, node: str | int, uid: str | int | None = None
) -> str:
    """Where node `node`'s keeper listens in attempt `restart` of SLURM job `job_id`: a
    folder of the user's own (`uid`, this process's by default) in the node's /tmp (a
    job's private /tmp, where the site gives jobs one, is shared by all its steps)."""
    uid = os.getuid() if uid is None else uid
    return f"/tmp/orchestrator-agent-{uid}/{job_id}.{restart}.{node}.sock"


class Stream:
    """The bytes the agent wrote, from offset `base` on, and where each frame begins."""

    def __init__(self) -> None:
        self.kept = bytearray()
        self.base = 0  # the offset of kept[0] in the node's stream
        # Offsets where whole frames begin, one at least TRIM_STEP after the last: where
        # trim may cut (a mark per frame would cost more than tiny frames themselves).
        self.starts: deque[int] = deque()
        self.parsed = 0  # the offset up to which frames were read
        self.payload_left = 0
        self.showing: tuple[str, int] | None = None  # an N or M frame's kind and payload start

    @property
    def end(self) -> int:
        return self.base + len(self.kept)

    def add(self, data: bytes) -> list[tuple[str, bytes]]:
        """Keep `data`; returns the (kind, payload) of the frames it completes that are also
        for this task's own output (N and M)."""
        self.kept += data
        shown: list[tuple[str, bytes]] = []
        while self.parsed < self.end:
            if self.payload_left:
                took = min(self.payload_left, self.end - self.parsed)
                self.parsed += took
                self.payload_left -= took
                if not self.payload_left and self.showing is not None:
                    kind, begins = self.showing
                    shown.append(
                        (kind, bytes(self.kept[begins - self.base : self.parsed - self.base]))
                    )
                    self.showing = None
                continue
            newline = self.kept.find(b"\n", self.parsed - self.base)
            if newline < 0:
                break
            words = bytes(self.kept[self.parsed - self.base : newline]).split()
            if not self.starts or self.parsed - self.starts[-1] >= TRIM_STEP:
                self.starts.append(self.parsed)
            self.parsed = self.base + newline + 1
            kind = words[0].decode(errors="replace") if words else ""
            if kind in PAYLOAD_KINDS and words[-1].isdigit():
                self.payload_left = int(words[-1])
                if kind in (Frame.SCRIPT_OUTPUT.value, Frame.MESSAGE.value):
                    self.showing = (kind, self.parsed)
        self.trim()
        return shown

    def at_frame_end(self) -> bool:
        """Whether what is kept ends with a whole frame (where one of ours may go)."""
        return not self.payload_left and self.parsed == self.end

    def trim(self) -> None:
        """Drop the oldest whole frames while more than KEPT_BYTES are kept."""
        while len(self.starts) > 1 and self.end - self.base > KEPT_BYTES:
            self.starts.popleft()
            cut = self.starts[0] - self.base
            del self.kept[:cut]
            self.base += cut

    def since(self, offset: int) -> tuple[int, int]:
        """Where a controller that has `offset` goes on from, and how many bytes it lost."""
        offset = min(max(0, offset), self.end)
        if offset >= self.base:
            return offset, 0
        return self.base, self.base - offset


class Relay:
    """Between the agent's pipes and one controller at a time on the node's socket."""

    def __init__(
        self,
        path: str,
        agent_out: int,
        agent_in: int,
        echo: tuple[int, int] | None,
        own: deque[bytes] | None = None,
    ) -> None:
        self.listener = listen(path)
        self.path = path
        self.agent_out, self.agent_in, self.echo = agent_out, agent_in, echo
        self.stream = Stream()
        self.client: socket.socket | None = None
        self.hello = b""  # the controller's first line, until it is whole
        self.sent: int | None = None  # the offset up to which the controller has it
        self.agent_done = False
        # Frames of the keeper's own (the time limit's warning), put into the stream at
        # the next end of one of the agent's; appended to from the signal handler.
        self.own: deque[bytes] = deque() if own is None else own
        self.selector = selectors.DefaultSelector()
        if self.listener is not None:
            self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(agent_out, selectors.EVENT_READ, "agent")

    def run(self, until: threading.Event) -> None:
        while not until.is_set():
            self.step(0.2)

    def step(self, timeout: float) -> None:
        for key, _ in self.selector.select(timeout):
            if key.data == "accept":
                self.accept()
            elif key.data == "agent":
                self.from_agent()
            elif key.data == "client":
                self.from_client()
        while self.own and self.stream.at_frame_end():
            self.stream.add(self.own.popleft())
        self.to_client()

    def accept(self) -> None:
        assert self.listener is not None
        conn, _ = self.listener.accept()
        self.drop_client()
        conn.setblocking(False)
        self.client, self.hello, self.sent = conn, b"", None
        self.selector.register(conn, selectors.EVENT_READ, "client")

    def drop_client(self) -> None:
        if self.client is not None:
            self.selector.unregister(self.client)
            self.client.close()
        self.client, self.sent = None, None

    def from_agent(self) -> None:
        data = os.read(self.agent_out, 1 << 20)
        if not data:
            self.selector.unregister(self.agent_out)
            self.agent_done = True
            return
        for kind, body in self.stream.add(data):
            if self.echo is None:
                continue
            if kind == Frame.SCRIPT_OUTPUT.value:
                write_all(self.echo[0], body)
            else:
                write_all(self.echo[1], b"orchestrator agent: " + body.rstrip(b"\n") + b"\n")

    def from_client(self) -> None:
        assert self.client is not None
        try:
            data = self.client.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.drop_client()
            return
        if self.sent is None:
            self.hello += data
            if b"\n" not in self.hello:
                return
            line, _, data = self.hello.partition(b"\n")
            words = line.split()
            asked = int(words[1]) if len(words) == 2 and words[1].isdigit() else 0
            self.sent, lost = self.stream.since(asked)
            self.client.setblocking(True)
            self.client.sendall(b"at %d %d\n" % (self.sent, lost))
            self.client.setblocking(False)
        if data:
            write_all(self.agent_in, data)  # the agent's commands

    def to_client(self) -> None:
        stream = self.stream
        if self.sent is not None and self.sent < stream.base:
            self.drop_client()  # it fell KEPT_BYTES behind: it asks again, and learns the loss
        while self.client is not None and self.sent is not None and self.sent < stream.end:
            start = self.sent - stream.base
            try:
                self.sent += self.client.send(stream.kept[start : start + SEND_BYTES])
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.drop_client()
                return

    def taken(self) -> bool:
        """Whether no controller waits for more: none is connected, or it has it all."""
        return self.client is None or (self.sent is not None and self.sent >= self.stream.end)

    def close(self) -> None:
        self.drop_client()
        if self.listener is None:
            return
        self.listener.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def private_folder(path: str) -> None:
    """Make (or check) the user's own folder for the sockets: a folder another user made
    (or can write to) in /tmp could serve or swap our socket; refuse it."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise OSError(f"{path} is not a folder of this user's alone (mode 700)")


def listen(path: str) -> socket.socket | None:
    """The node's socket for controllers, or None (said on stderr) where it cannot be made:
    the job runs all the same, without a way in for the launcher."""
    try:
        private_folder(os.path.dirname(path))
        if os.path.exists(path):
            os.unlink(path)  # an earlier job's with the same numbers: ours now
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(path)
        listener.listen(8)
        return listener
    except OSError as error:
        print(f"orchestrator agent: no socket for the launcher: {error}", file=sys.stderr)
        return None


def write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass  # the reader is gone; the stream still keeps it


def node_config(config: dict, environ: dict[str, str]) -> dict:
    """The step's config on this node: the batch script's, with this node's folder (the
    job's, as the script's node part names it) and its ranks (`nproc` a node, in node
    order), the folder srun started the task in (the job's working directory) and no
    controller to wait for. Without a job folder (a script rendered for sbatch by hand)
    the ranks' output goes to SLURM's files only, and no ranks are shipped."""
    job_dir = environ.get("ORCHESTRATOR_JOB_DIR")
    node = int(environ.get("SLURM_NODEID", "0"))
    node_dir, ranks = None, []
    if job_dir:
        restart = environ.get("SLURM_RESTART_COUNT", "0")
        node_dir = f"{job_dir}/attempt{restart}/node{node}"
        nproc = int(config.get("nproc", 0))
        ranks = list(range(node * nproc, (node + 1) * nproc))
    return {
        **config,
        "node_dir": node_dir,
        "ranks": ranks,
        "cwd": os.getcwd(),
        "heartbeat_timeout": 0,
    }


def warned_frame(signum: int) -> bytes:
    """G SIG t - -: the time limit's (or a preemption's) signal reached this node's step
    (the batch script passes it on to every rank; how many were sent is not ours to
    count, hence the dashes the agent's own G frame has numbers in)."""
    name = signal.Signals(signum).name.removeprefix("SIG")
    return frame(Frame.TIME_WARNING, name, f"{time.time():.6f}", "-", "-")


def main() -> int:
    # The time limit's warning (SIGUSR1/2, which SLURM or the batch script sends to every
    # process of the step) is for the ranks: a handler, not "ignore", so that the processes
    # the agent starts get the default back (the node script ignores it itself). Once the
    # relay runs, the handler also tells the launcher (a G frame, warned_frame).
    warned: deque[bytes] = deque()
    came: list[HeldWarning] = []  # the warning, once it came: held for ranks still starting

    def on_warning(number: int, _frame: object) -> None:
        warned.append(warned_frame(number))
        if not came:
            targets = rank_targets(os.getpid())
            came.append(HeldWarning(number, catching_now(targets, number)))

    for signum in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, on_warning)
    config = node_config(read_config(), dict(os.environ))
    os.environ.pop(CODE_ENV, None)
    env = os.environ
    path = socket_path(
        env.get("SLURM_JOB_ID", "0"),
        env.get("SLURM_RESTART_COUNT", "0"),
        env.get("SLURM_NODEID", "0"),
    )
    echo = (os.dup(1), os.dup(2))
    commands_r, commands_w = os.pipe()
    frames_r, frames_w = os.pipe()
    os.dup2(commands_r, 0)
    os.dup2(frames_w, 1)
    os.close(commands_r)
    os.close(frames_w)
    # Without a job folder (a script rendered for sbatch by hand) the script's output has
    # no other place to go than SLURM's; with one, the agent ships it to the launcher.
    relay = Relay(path, frames_r, commands_w, None if config["node_dir"] else echo, warned)
    done = threading.Event()
    thread = threading.Thread(target=relay.run, args=(done,), name="relay", daemon=True)
    thread.start()
    agent = Agent(config)
    holder = threading.Thread(target=hold, args=(came, agent, done), name="held", daemon=True)
    holder.start()
    agent.run()
    os.close(1)  # the relay reads the agent's last frame, then the end of its stream
    deadline = time.monotonic() + DRAIN_S
    while time.monotonic() < deadline and not (relay.agent_done and relay.taken()):
        time.sleep(0.05)
    done.set()
    thread.join(timeout=2)
    relay.close()
    rc = agent.processes.script_rc
    if rc is None:
        return 1
    rc = rc if rc >= 0 else 128 - rc  # a signal's number, as a shell says it
    if rc and (came or agent.warned):
        return stopped_on_warning(path, rc)
    return rc


def hold(came: list[HeldWarning], agent: Agent, done: threading.Event) -> None:
    """Once the warning came, send it to each rank that starts catching it later (a rank
    still importing its libraries when SLURM sent it ignored it), and say so."""
    while not done.wait(HELD_POLL_S):
        if not came:
            continue
        agent.warned = True
        for rank in came[0].deliver(rank_targets(os.getpid())):
            name = signal.Signals(came[0].signum).name
            agent.outbox.message(
                f"rank {rank} was still starting when {name} came: sent it now that it catches it"
            )


def stopped_on_warning(path: str, rc: int) -> int:
    """The step's end after the warning, with the script's nonzero code `rc` (the ranks
    saved and stopped, e.g. 138): not a failure of this node, so srun's task ends 0 and
    srun (--kill-on-bad-exit) does not end the step on the nodes whose ranks still save.
    The code is kept beside the socket (`stopped_file`): the batch script, on node 0,
    ends with it."""
    try:
        with open(stopped_file(path), "w") as out:
            out.write(f"{rc}\n")
    except OSError as error:
        print(f"orchestrator agent: cannot keep the exit code {rc}: {error}", file=sys.stderr)
    return 0


def stopped_file(path: str) -> str:
    """Where the keeper whose socket is `path` keeps its script's code after the warning."""
    return path.removesuffix(".sock") + ".stopped"


if __name__ == "__main__":  # pragma: no cover - run on the node through the bundle
    sys.exit(main())
