"""`orchestrator exec --run RUN`: a shell command on every node of a running SLURM run's
job, as one step of that job.

The nodes are the job's allocation now (squeue's node list of the job status.json follows,
`slurm_job_id`), reached through SLURM itself: one

    srun --overlap --jobid JOB --nodes N --ntasks N --ntasks-per-node 1 --kill-on-bad-exit=0
         --quiet --label --job-name TAG bash -c WRAPPER orchestrator-exec TAG COMMAND

run on this machine. One step for the whole allocation rather than one srun per node: a
single request to the controller and a single process here, however many nodes the job
has, and a single thing to stop on Ctrl-C; what one step cannot tell by itself (which node
printed a line, each node's exit status) the wrapper says, on lines of its own. `--label`
puts the task's number before each line; the wrapper's first line (`TAG node NAME`, NAME
the task's $SLURMD_NODENAME) names the task's node, so a line is attributed to the node
SLURM ran it on, whatever order the tasks were laid out in, and its last (`TAG exit CODE`)
is the command's exit status on that node. TAG (orchestrator-exec-HEX, also the step's
name) is new each time, so no output of the command is taken for the wrapper's. Without
--unbuffered, srun passes a task's output on by whole lines, so that lines of different
nodes never mix (a partial line waits for its newline or the command's end). `--overlap`
shares the job's CPUs, memory and GPUs with its running steps (the command sees the job's
GPUs); `--kill-on-bad-exit=0` keeps a node whose command fails from ending the others'.
The command and TAG reach the node's shell as arguments ("$1", "$2"), never as part of
the script.

Ctrl-C (or SIGTERM) sends srun SIGTERM, which it passes on to every task, ending the step;
one that has not ended `grace` seconds later is killed (srun with SIGKILL, the step with
`scancel --signal=KILL JOB.STEP`). Only a run submitted from this machine is reached: one
submitted on a login node (`--login`) is refused, since an srun started there over SSH
could not be handed the Ctrl-C.
"""

from __future__ import annotations

import os
import re
import secrets
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from orchestrator.backends.scheduler_states import SchedulerState
from orchestrator.console.sink import LogSink, use_color
from orchestrator.errors import ConfigError, Interrupted, OrchestratorError
from orchestrator.nodes.execute import NodeResult
from orchestrator.options.backend_facts import facts_of
from orchestrator.options.display import ConsoleOptions
from orchestrator.record.runs import RunRecord, run_status
from orchestrator.record.states import NodePhase
from orchestrator.slurm.control.client import SlurmCommands, expand_nodelist, query
from orchestrator.slurm.control.parse import JobInfo
from orchestrator.supervise.stopping import signals_to

STEP_NAME = "orchestrator-exec"
MARK_ENV = "ORCHESTRATOR_EXEC"  # in the command's environment on every node: the run's id
# $1: TAG, $2: the command; the command's exit status is the wrapper's too.
WRAPPER = (
    'printf "%s node %s\\n" "$1" "$SLURMD_NODENAME"; bash -c "$2"; '
    'code=$?; printf "%s exit %d\\n" "$1" "$code"; exit $code'
)
KINDS = {"ssh": "an SSH run", "local": "a local run"}
KILL_WAIT_S = 5.0  # after SIGKILL, for srun to go
LABEL = re.compile(rb"^ *(\d+): ?(.*)$", re.DOTALL)
# srun's own word on a task that failed: the closing table says it.
TASK_EXIT = re.compile(rb"^srun: error: \S+: tasks? [\d,-]+: (Exited with exit code \d+|Killed)")
# slurmstepd's word on the step's end, in a task's stream: SLURM's line, not the command's.
STEP_END = re.compile(rb"^slurmstepd(-\S+)?: error: \*\*\* STEP ")


@dataclass(frozen=True)
class Allocation:
    """A running SLURM run's job and its nodes, in the job's node list's order."""

    run_id: str
    job_id: int
    hosts: tuple[str, ...]


def job_of(record: RunRecord, status: Mapping) -> int:
    """The SLURM job whose nodes `exec --run` uses: the one status.json follows. A
    ConfigError (exit 2) for a run that is not SLURM's, was submitted on a login node,
    has ended, or has no job yet."""
    run = record.run_id
    current = run_status(dict(status))
    if not facts_of(current.backend).exec_in_job_step:
        hosts = ", ".join(str(n.get("host")) for n in status.get("nodes") or []) or "none"
        raise ConfigError(
            f"run {run} is {KINDS.get(current.backend or '', 'not a SLURM run')} (nodes: "
            f"{hosts}): its "
            "record does not keep how its nodes were reached (user, port, interpreter, "
            "SSH flags); give the hostfile it was launched with: `orchestrator exec "
            "HOSTFILE -- COMMAND`"
        )
    login = status.get("slurm_login")
    if login:
        raise ConfigError(
            f"run {run} was submitted on {login} (--login): exec --run runs srun on this "
            f"machine only; on {login}, run it in a step of the job: `srun --overlap "
            f"--jobid {status.get('slurm_job_id')} COMMAND`"
        )
    if current.ended:
        raise ConfigError(f"run {run} has ended ({current.state}): its job has no nodes now")
    job_id = status.get("slurm_job_id")
    if job_id is None:
        raise ConfigError(
            f"run {run} has no SLURM job yet (state {current.state}); try again once "
            f"`orchestrator status {run}` says it runs"
        )
    return int(job_id)


def check_running(run_id: str, job_id: int, info: JobInfo) -> None:
    """Only a running job's nodes are there to use (a ConfigError names its state)."""
    if info.scheduler_state == SchedulerState.RUNNING:
        return
    reason = f", reason {info.reason}" if info.reason and info.reason != "None" else ""
    if info.scheduler_state == SchedulerState.QUEUED:
        what = f"is queued (PENDING{reason})"
    elif info.ended:
        what = f"has ended ({info.state}{reason})"
    else:
        what = f"is {info.state}{reason}, not running"
    raise ConfigError(
        f"run {run_id}: SLURM job {job_id} {what}; exec --run needs a running job's nodes"
    )


def find_allocation(record: RunRecord, commands: SlurmCommands | None = None) -> Allocation:
    """The job of a running SLURM run and its nodes, as SLURM says now."""
    job_id = job_of(record, record.read_status())
    own = commands is None
    commands = commands or SlurmCommands()
    try:
        info = query(commands, job_id)
        check_running(record.run_id, job_id, info)
        hosts = tuple(expand_nodelist(commands, info.nodelist))
    finally:
        if own:
            commands.close()
    if not hosts:
        raise OrchestratorError(f"run {record.run_id}: squeue names no node of job {job_id}")
    return Allocation(record.run_id, job_id, hosts)


def step_argv(job_id: int, nnodes: int, tag: str, command: str) -> list[str]:
    """srun's command line: one task on each of the job's `nnodes` nodes, running the
    wrapper around `command` (see the module docstring). No shell reads it here."""
    return [
        "srun",
        "--overlap",
        f"--jobid={job_id}",
        f"--nodes={nnodes}",
        f"--ntasks={nnodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=0",
        "--quiet",
        "--label",
        f"--job-name={tag}",
        "bash",
        "-c",
        WRAPPER,
        STEP_NAME,
        tag,
        command,
    ]


class StepOutput:
    """srun's labelled output, read: each line to its node (an index into `hosts`), the
    wrapper's lines taken out, each node's exit status kept."""

    def __init__(self, tag: str, hosts: Sequence[str]) -> None:
        self.hosts = list(hosts)
        self.mark = re.compile(rb"^(.*)" + re.escape(tag.encode()) + rb" (node|exit) (\S*)$")
        self.node_of: dict[int, int] = {}  # task -> node, as its first line says
        self.codes: dict[int, int] = {}  # node -> exit status
        self.partial = b""

    def feed(self, data: bytes) -> list[tuple[int | None, bytes]]:
        """(node, line) for each whole line in `data`; node None: srun's own line."""
        data = self.partial + data
        cut = data.rfind(b"\n") + 1
        self.partial = data[cut:]
        lines = []
        for line in data[:cut].splitlines(keepends=True):
            lines += self.line(line)
        return lines

    def end(self) -> list[tuple[int | None, bytes]]:
        """What is left once srun has ended (a last line without a newline)."""
        rest, self.partial = self.partial, b""
        return self.line(rest + b"\n") if rest else []

    def line(self, line: bytes) -> list[tuple[int | None, bytes]]:
        labelled = LABEL.match(line.rstrip(b"\n"))
        if labelled is None:
            return [] if TASK_EXIT.match(line) else [(None, line)]
        task, text = int(labelled.group(1)), labelled.group(2)
        if STEP_END.match(text):
            return [(None, text + b"\n")]
        mark = self.mark.match(text)
        if mark is None:
            return [(self.node(task), text + b"\n")]
        before, kind, value = mark.groups()
        if kind == b"node":
            name = value.decode(errors="replace")
            if name in self.hosts:
                self.node_of[task] = self.hosts.index(name)
        elif value.isdigit():
            self.codes[self.node(task)] = int(value)
        return [(self.node(task), before + b"\n")] if before else []

    def node(self, task: int) -> int:
        """The task's node: as its first line said, else the task's number (srun lays one
        task on each node, in the node list's order)."""
        return self.node_of.get(task, task)


def step_results(
    hosts: Sequence[str],
    codes: Mapping[int, int],
    outputs: Mapping[int, list[bytes]],
    stopped: str = "",
    srun_code: int | None = None,
) -> list[NodeResult]:
    """Every node's result: its command's exit status, or why there is none (`stopped`:
    the step was ended, e.g. `time limit reached`)."""
    results = []
    for index, host in enumerate(hosts):
        text = b"".join(outputs.get(index, [])).decode(errors="replace")
        code = codes.get(index)
        if code is not None:
            results.append(
                NodeResult(host, code, text, NodePhase.SUCCEEDED if code == 0 else NodePhase.FAILED)
            )
        elif stopped:
            results.append(NodeResult(host, None, text, NodePhase.STOPPED, stopped))
        else:
            why = f"no exit status came back (srun exited with {srun_code})"
            results.append(NodeResult(host, None, text, NodePhase.LOST, why))
    return results


class _Signals:
    """The first stop signal that came (signals_to's target)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def interrupt(self, signum: int) -> None:
        self.signum = self.signum or signum


def run_step(
    allocation: Allocation,
    command: str,
    *,
    grace: float,
    time_limit: float | None = None,
    console: BinaryIO | None = None,
    shown: ConsoleOptions | None = None,
) -> list[NodeResult]:
    """Run `command` once on every node of `allocation` as a step of its job; each node's
    result. Its output, attributed (`[host] line`), goes to `console` as it comes."""
    shown = shown or ConsoleOptions()
    hosts = allocation.hosts
    labels = dict(enumerate(hosts))
    sink = LogSink(None, {}, labels, console, use_color(console, shown.color), fold=shown.fold)
    tag = f"{STEP_NAME}-{secrets.token_hex(8)}"
    output = StepOutput(tag, hosts)
    outputs: dict[int, list[bytes]] = {}

    def show(lines: list[tuple[int | None, bytes]]) -> None:
        for node, line in lines:
            if node is None or node not in labels:
                sink.note(line.decode(errors="replace"))
            else:
                outputs.setdefault(node, []).append(line)
                sink.node_output(node, line)
        sink.flush()

    argv = step_argv(allocation.job_id, len(hosts), tag, command)
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C here is ours to pass on
            env={**os.environ, MARK_ENV: allocation.run_id},
        )
    except FileNotFoundError:
        raise ConfigError(
            "srun: command not found: SLURM's client commands are not installed here or "
            "not on PATH; run exec --run where the run was launched"
        ) from None
    signals = _Signals()
    started = time.monotonic()
    stopping_at: float | None = None
    timed_out = False
    with signals_to(signals):
        try:
            while True:
                now = time.monotonic()
                if stopping_at is None and (signals.signum or timed_out):
                    stopping_at = now
                    proc.send_signal(signal.SIGTERM)  # srun passes it on to every task
                if stopping_at is not None and now - stopping_at > grace:
                    kill_step(proc, allocation.job_id, tag)
                    break
                if time_limit is not None and now - started > time_limit:
                    timed_out = True
                readable, _, _ = select.select([proc.stdout], [], [], 0.2)
                if readable:
                    chunk = os.read(proc.stdout.fileno(), 65536)  # type: ignore[union-attr]
                    if not chunk:
                        break
                    show(output.feed(chunk))
            show(output.end())
            code = proc.wait()
        finally:
            if proc.poll() is None:  # an error here: the step must not outlive us
                kill_step(proc, allocation.job_id, tag)
            proc.stdout.close()  # type: ignore[union-attr]
            sink.close()
    if signals.signum is not None:
        raise Interrupted(signals.signum, "the command")
    stopped = "time limit reached" if timed_out else ""
    return step_results(hosts, output.codes, outputs, stopped, code)


def kill_step(proc: subprocess.Popen, job_id: int, tag: str) -> None:
    """srun killed, and the step it started killed on every node (srun cannot pass a
    SIGKILL on): found by its name in squeue's steps of the job."""
    proc.kill()
    try:
        proc.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        pass
    commands = SlurmCommands()
    try:
        _, out, _ = commands.run(["squeue", "-h", "-s", "-j", str(job_id), "-o", "%i|%j"])
        for line in out.splitlines():
            step, _, name = line.strip().partition("|")
            if name == tag:
                commands.run(["scancel", "--signal=KILL", step])
    finally:
        commands.close()
