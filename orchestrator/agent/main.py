"""The node agent: runs on every node for the length of a run, standard library only.

The controller starts it with the node's interpreter (a local subprocess or an SSH exec
channel) through `BOOTSTRAP`, then sends its modules (as bytecode and as source) and a
step's config over stdin (orchestrator.agent.bootstrap, protocol.py). The agent then:

- starts the node script (`bash nodeN.sh`) or a command in a session of its own, and
  becomes the child subreaper (processes.py);
- streams each rank's output as whole lines, the script's own output (torchrun's), and each
  rank's exit code and time (ranks.py, shipping.py), in the frames of protocol.py;
- samples, every few seconds, what the run's processes use (CPU, memory, GPUs) and ships
  it with the ranks' own metrics (sampling.py);
- sends the time limit's warning (`signal USR1`) to every rank's process (stacks.py);
- says, once per address and port, when the step's connections to it get no answer: the
  store or a peer on a path that drops them (connects.py);
- stops everything on `stop GRACE` (SIGTERM to every descendant, SIGKILL to what is left
  after GRACE seconds), at once on `kill`, and by itself when the controller goes away:
  stdin closes (controller killed, connection dropped) or no heartbeat for a while
  (network lost).

After X the agent waits (up to IDLE_S) for another step of the same run: a `next` line and
a length-prefixed config. So the launch's preflight probe and its job share one agent, and
one SSH session (one login shell), per node. It ends when stdin closes.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time

from orchestrator.agent import runtime as container_runtime
from orchestrator.agent.connects import LOOK_S, ConnectWatch
from orchestrator.agent.controller import ControllerHost
from orchestrator.agent.disk import DiskWatch, is_fault
from orchestrator.agent.flight import FOLDER as FLIGHT_FOLDER
from orchestrator.agent.flight import dumps_left, take_dumps
from orchestrator.agent.hook import STACKS_FOLDER, install_hook
from orchestrator.agent.processes import (
    ProcessTree,
    become_subreaper,
    claim_node_dir,
    descendants_of,
    script_command,
    signal_pid,
)
from orchestrator.agent.programs.route import addresses
from orchestrator.agent.protocol import (
    AGENT_BEATS,
    BEATS_DEFERRED,
    FIRST_BEATS,
    GRACE_S,
    HEARTBEAT_TIMEOUT_S,
    IDLE_S,
    STALL_S,
    Command,
    CommandReader,
    Frame,
    beat_intervals,
    frame,
    next_config,
    read_config,
)
from orchestrator.agent.ranks import NodeRanks, rank_pids
from orchestrator.agent.sampling import QUIET_SAMPLE_S, SAMPLE_S, Sampler, differs
from orchestrator.agent.shipping import Outbox, PipeLines
from orchestrator.agent.wakeup import QUIET_S, Wakeup, drain

# Type names only, not imported at run time (see processes.py).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO

POLL_S = 0.02  # while ranks print or the run stops: how often their files are read
# Quiet: the wait doubles up to this where nothing reports writes to the rank files (up to
# wakeup.QUIET_S where the kernel does); a command, the script's output or a signal wakes it.
IDLE_POLL_S = 0.1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
STACK_TIMEOUT_S = 5.0  # for each way of taking a rank's stack


class Agent:
    """One step of a run on this node: start it, ship its output, stop it when told."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.outbox = Outbox(config.get("secrets", []))
        self.processes = ProcessTree(self.outbox.message)
        node_dir = config.get("node_dir")
        self.node_dir = os.path.expanduser(node_dir) if node_dir else None
        self.disk = DiskWatch(self.node_dir, node_dir, self.outbox)
        self.ranks = NodeRanks(self.node_dir, config.get("ranks", []), self.outbox, self.disk)
        self.script_out: PipeLines | None = None
        self.commands = CommandReader()
        self.handlers: dict[Command, Callable] = {  # what each command read does
            Command.STOP: self.stop_asked,
            Command.KILL: self.kill_asked,
            Command.STACKS: self.stacks_asked,
            Command.END: self.end_ranks,
            Command.SIGNAL: self.signal_asked,
        }
        self.stdin_open = True
        self.controller_silent = False
        self.lock: IO[str] | None = None
        self.wait = POLL_S  # the loop's select timeout: POLL_S while busy, up to quiet_wait
        self.wakeup: Wakeup | None = None
        self.quiet_wait = IDLE_POLL_S
        self.last_hb_in = time.monotonic()
        self.controller_host = ControllerHost()
        self.beating = threading.Event()
        self.started_wall = time.time()
        self.flight_shipped: dict[int, float] = {}  # rank -> when its dump was last asked for
        self.warned = False  # the ranks were sent the warning (`signal`)

    def stop(self, reason: str, grace: float | None = None) -> None:
        """Stop the step's processes: after the config's grace unless told another."""
        if self.ranks.stopped_at is None:  # ranks that end from now on were stopped
            self.ranks.stopped_at = time.time()
        self.processes.begin_stop(
            float(self.config.get("grace", GRACE_S)) if grace is None else grace, reason
        )

    def start(self) -> None:
        if self.node_dir:
            self.lock = claim_node_dir(self.node_dir)
        argv, cwd, env = script_command(self.config, self.node_dir)
        hook = self.config.get("stack_hook")
        if hook and self.node_dir:  # the ranks' own way to write their stacks (stacks.py)
            env = install_hook(hook, self.node_dir, env)
        if self.config.get("container"):  # what crosses into it, on its stdin (runtime.py)
            env[container_runtime.NAMES_ENV] = container_runtime.carried_names(
                env, dict(os.environ)
            )
        proc = self.processes.start(argv, cwd, env)
        self.script_out = PipeLines(proc.stdout)
        addrs = addresses() or "-"  # the controller names a peer by them (connects.py)
        self.outbox.send(frame(Frame.STARTED, proc.pid, f"{time.time():.6f}", addrs))

    def run(self) -> int:
        become_subreaper()
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        # A signal to the agent itself (e.g. the node shutting down) is an orderly stop.
        for signum in STOP_SIGNALS:
            signal.signal(signum, lambda *_: self.stop("agent signalled"))
        os.set_blocking(1, False)
        try:
            self.start()
        except OSError as exc:
            if is_fault(exc):
                self.disk.report(exc)
            self.outbox.message(f"cannot start: {exc}")
            self.outbox.send(frame(Frame.FINISHED, 127, f"{time.time():.6f}"))
            self.outbox.flush(10)
            return 127
        # The rank files' watch, where there are rank files (a command's step has none).
        self.wakeup = Wakeup(self.node_dir if self.ranks.files else None)
        if self.wakeup.files is not None:
            # What only a pass notices (a silent controller) must not wait much longer.
            timeout = float(self.config.get("heartbeat_timeout", HEARTBEAT_TIMEOUT_S))
            longest = min(QUIET_S, timeout / 4) if timeout > 0 else QUIET_S
            self.quiet_wait = max(IDLE_POLL_S, longest)
        threads = [threading.Thread(target=self.heartbeats, name="heartbeats", daemon=True)]
        sample_s = float(self.config.get("sample_s", SAMPLE_S))
        if self.ranks.files and sample_s > 0:
            threads.append(
                threading.Thread(target=self.samples, args=(sample_s,), name="samples", daemon=True)
            )
        if self.ranks.files:  # a job's step: connections that get no answer (connects.py)
            threads.append(threading.Thread(target=self.connects, name="connects", daemon=True))
        for thread in threads:
            thread.start()
        try:
            while True:
                self.step()
                if self.finished():
                    break
        finally:
            self.wakeup.close()
        self.beating.set()  # nothing may follow X
        for thread in threads:
            thread.join()
        self.ranks.drain(10 if self.stdin_open else 2)
        self.ranks.ship_exits()
        self.remove_container()
        if self.processes.script_rc != 0 and self.node_dir:
            self.ship_flight_left()
        if self.processes.script_rc != 0 and not self.processes.stopping:
            self.disk.probe()  # the script failed by itself: was it its disk?
        self.ranks.mask_files()
        self.outbox.send(frame(Frame.FINISHED, self.processes.script_rc, f"{time.time():.6f}"))
        self.outbox.flush(10 if self.stdin_open else 2)
        return 0

    def remove_container(self) -> None:
        """The step's container, by its name, whatever ended the step (runtime.py)."""
        asked = self.config.get("container") or {}
        runtime = container_runtime.chosen_runtime(self.node_dir, asked.get("runtime", ""))
        if runtime and asked.get("name"):
            said = container_runtime.remove(runtime, asked["name"])
            if said:
                self.outbox.message(said)

    def may_wait_for_next(self) -> bool:
        """After run(): the controller got everything and is still there to send more."""
        return (
            self.stdin_open
            and self.outbox.open
            and not self.outbox.data
            and not self.controller_silent
        )

    def step(self) -> None:
        script_out = self.script_out if self.script_out and self.script_out.pipe else None
        readers = [0] if self.stdin_open else []
        if script_out is not None:
            readers.append(script_out.pipe.fileno())
        wakeup = self.wakeup
        if wakeup is not None:
            readers += wakeup.descriptors(quiet=self.wait > POLL_S)
        writers = [1] if self.outbox.data and self.outbox.open else []
        outputs = self.outbox.outputs
        try:
            readable, writable, _ = select.select(readers, writers, [], self.wait)
        except InterruptedError:
            return
        if wakeup is not None:
            if wakeup.signals in readable:
                drain(wakeup.signals)
            wakeup.drain_files()  # before the files are read: a later write wakes the next select
        if 1 in writable:
            self.outbox.write_some()
        if 0 in readable:
            self.read_commands()
        data = b""
        if (
            script_out is not None
            and script_out.pipe.fileno() in readable
            and (data := script_out.read_lines())
        ):
            # Read after the stop began, or once every rank here exited 0: torchrun's own
            # shutdown (a traceback for the signal we sent; "Error waiting on exit barrier"
            # when node 0's torchrun left first), for the node's log, not the console.
            quiet = self.processes.stopping or self.ranks.all_succeeded()
            self.outbox.send_masked(Frame.SCRIPT_OUTPUT, int(quiet), payload=data)
        self.ranks.ship_output()
        self.ranks.ship_exits()
        self.processes.reap()
        if self.warned and self.processes.script_rc is None and not self.processes.stopping:
            self.after_warning()
        now = time.monotonic()
        self.disk.tick(now)
        self.check_controller(now)
        ending = self.processes.stopping or self.processes.script_rc is not None
        if ending:
            self.processes.enforce_stop(now, self.ranks.all_exited())
        # An idle agent costs next to nothing: it backs off while nothing happens (a
        # heartbeat in, a signal or a child's end is handled in this pass and changes nothing).
        busy = (
            ending
            or self.outbox.outputs != outputs
            or bool(data)
            or (wakeup is not None and wakeup.files in readable)
        )
        self.wait = POLL_S if busy else min(self.quiet_wait, self.wait * 2)

    def after_warning(self) -> None:
        """Every rank here ended after the warning, one at least not with 0 (it saved and
        stopped): what is left is torchrun's own exit after its workers' failure, seconds
        that nothing waits for. (The other nodes' ranks are not ours: they save on.)"""
        if self.ranks.all_exited() and not self.ranks.all_succeeded():
            self.stop("every rank here stopped on the warning")

    def heartbeats(self) -> None:
        """H from a thread of its own, whatever the loop is doing (protocol.beat_intervals);
        a steady one waits `pause` after the last bytes written, BEATS_DEFERRED times at most."""
        timeout = float(self.config.get("heartbeat_timeout", HEARTBEAT_TIMEOUT_S))
        for number, pause in enumerate(beat_intervals(timeout, AGENT_BEATS)):
            due, deferred = time.monotonic() + pause, 0
            while True:
                if self.beating.wait(max(0.0, due - time.monotonic())):
                    return
                wrote = self.outbox.wrote_at
                if number < FIRST_BEATS or deferred >= BEATS_DEFERRED or wrote <= due - pause:
                    break
                due, deferred = wrote + pause, deferred + 1
            t1, t2 = self.commands.ping
            self.outbox.send(frame(Frame.HEARTBEAT, f"{time.time():.6f}", t1, t2))
            self.outbox.write_some()

    def samples(self, every: float) -> None:
        """A node sample every `every` seconds, each over the time since the last; shipped
        (P) when it differs from the last one shipped, or QUIET_SAMPLE_S after it."""
        import json  # here, not at the top: a step without samples (`exec`) never needs it

        sampler = Sampler(os.getpid())
        sampler.sample()  # the baseline the first sample's CPU is measured from
        shipped, shipped_at = None, 0.0
        while not self.beating.wait(every):
            sample, now = sampler.sample(), time.monotonic()
            if not differs(shipped, sample) and now - shipped_at < QUIET_SAMPLE_S:
                continue
            data = json.dumps(sample, separators=(",", ":")).encode()
            if self.beating.is_set():
                return
            self.outbox.send(frame(Frame.NODE_SAMPLE, payload=data))
            self.outbox.write_some()  # now, not at the loop's next pass (up to QUIET_S away)
            shipped, shipped_at = sample, now

    def connects(self) -> None:
        """Every LOOK_S, the step's connections that get no answer: a U for each remote."""
        watch = ConnectWatch()
        while not self.beating.wait(LOOK_S):
            if self.processes.stopping:
                return  # what fails now was stopped
            for address, port, seconds, role, who in watch.look(
                self.processes.descendants, time.monotonic()
            ):
                self.outbox.send(frame(Frame.NO_ANSWER, address, port, f"{seconds:.0f}", role, who))
                self.outbox.write_some()

    def check_controller(self, now: float) -> None:
        """No word from the controller for the heartbeat timeout: stop, unless its host
        still answers (a busy or stalled controller, not a gone one); then wait up to the
        stall timeout."""
        timeout = float(self.config.get("heartbeat_timeout", HEARTBEAT_TIMEOUT_S))
        silent = now - self.last_hb_in
        if timeout <= 0 or silent <= timeout or self.processes.stopping:
            return
        stall = max(timeout, float(self.config.get("stall_timeout", STALL_S)))
        answers = self.controller_host.answers(now)
        if answers is None and silent <= stall:
            return  # asked; the answer comes within a few seconds
        if answers and silent <= stall:
            if not self.controller_silent:
                self.controller_silent = True
                self.outbox.message(
                    f"no word from the controller for {silent:.0f} s, but its host answers: "
                    f"waiting up to {stall:g} s"
                )
            return
        self.controller_silent = True
        why = "its host does not answer" if not answers else f"waited {stall:g} s"
        self.stop(f"no word from the controller for {silent:.0f} s; {why}")

    def finished(self) -> bool:
        if self.processes.script_rc is None:
            return False
        alive = self.processes.descendants()
        if alive and not self.processes.stopping:
            self.stop(f"{len(alive)} process(es) left running after the node script ended")
        script_output_open = self.script_out is not None and self.script_out.pipe is not None
        return not alive and not script_output_open

    def read_commands(self) -> None:
        try:
            chunk = os.read(0, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            self.stdin_open = False
            self.stop("the controller's connection closed")
            return
        self.last_hb_in = time.monotonic()
        if self.controller_silent:
            self.controller_silent = False
            self.controller_host.forget()
        for command, argument in self.commands.feed(chunk):
            self.handlers[command](argument)

    def stop_asked(self, grace: float | None) -> None:
        self.stop(f"{Command.STOP} requested", grace)

    def kill_asked(self, grace: float) -> None:
        self.stop(f"{Command.KILL} requested", grace)

    def stacks_asked(self, argument: str) -> None:
        threading.Thread(target=self.ship_stacks, args=argument.split(), daemon=True).start()

    def signal_asked(self, name: str) -> None:
        """`signal USR1|USR2`: the time limit's warning to every rank, answered by G."""
        from orchestrator.agent.limit_warning import warn_ranks

        self.warned = True
        self.outbox.send(warn_ranks(os.getpid(), name))

    def ship_stacks(self, seq: str, method: str, *also: str) -> None:
        """`stacks SEQ METHOD [flight]`: every rank's stacks (stacks.py), as one K frame,
        after (with `flight`) each rank's flight recorder dump (flight.py) as an L frame.
        In a thread of its own: a rank's dump may take a second, and the loop goes on."""
        import json  # here, not at the top: only a run asked for its stacks needs it

        from orchestrator.agent.py_spy import find_py_spy
        from orchestrator.agent.stacks import take_stacks

        hook_dir = os.path.join(self.node_dir, STACKS_FOLDER) if self.node_dir else ""
        py_spy = None if method == "signal" else find_py_spy()
        pids = rank_pids(os.getpid())
        records = take_stacks(pids, hook_dir, py_spy, STACK_TIMEOUT_S)
        if "flight" in also:
            folder = os.path.join(self.node_dir or "", FLIGHT_FOLDER)
            for rank, dump in take_dumps(pids, folder, STACK_TIMEOUT_S).items():
                self.flight_shipped[rank] = time.time()
                said, data = ("ok", dump) if isinstance(dump, bytes) else ("no", dump.encode())
                self.outbox.send(frame(Frame.FLIGHT_DUMP, seq, rank, said, payload=data))
        data = json.dumps(list(records.values()), separators=(",", ":")).encode()
        self.outbox.send(frame(Frame.STACKS, seq, payload=data))
        self.outbox.write_some()

    def end_ranks(self, ranks: str) -> None:
        """`end RANK,...`: SIGKILL to those ranks' processes (the rank's own and those it
        started); torchrun sees its workers fail and, with restarts left, starts them again."""
        wanted = {int(r) for r in ranks.split(",") if r.isdigit()}
        for rank, pid in rank_pids(os.getpid()).items():
            if rank in wanted:
                for each in [pid, *descendants_of(pid)]:
                    signal_pid(each, signal.SIGKILL)

    def ship_flight_left(self) -> None:
        """After a failure: the flight recorder dumps torch wrote by itself (an NCCL
        collective that timed out) since the step began, as `L end` frames."""
        folder = os.path.join(self.node_dir or "", FLIGHT_FOLDER)
        for rank, dump in dumps_left(folder, self.started_wall, self.flight_shipped).items():
            self.outbox.send(frame(Frame.FLIGHT_DUMP, "end", rank, "ok", payload=dump))


def main() -> int:
    config: dict | None = read_config()
    while True:
        agent = Agent(config)
        rc = agent.run()
        if not agent.may_wait_for_next():
            return rc
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)  # nothing runs now: a signal just ends it
        config = next_config(IDLE_S)
        if config is None:
            return rc
