"""Following a submitted SLURM job to its end, as `launch --backend slurm` shows it.

The follower is the SLURM side of the one supervision loop (orchestrator.supervise.run_loop:
the follower is its `Watch`): before each of the attempt supervisor's passes, squeue (sacct
once it has ended) says queued/running/ended, as often as following/cadence.py says (less
often while the node agents answer; the loop waits on their frames meanwhile). Once nodes
run, the node agents are reached (following/node_agents.py) and what they send (the ranks'
lines, metrics and exits, the nodes' starts, ends and samples, stacks) goes into the same
`LogSink` and through the same `Supervisor.step` as over SSH (srun runs here, or on the
--login node); for a node whose agent cannot be reached, the files it writes in the run's job
folder say the same (following/stream.py). SLURM stops the nodes (srun --kill-on-bad-exit,
scancel); the Supervisor decides the first failing rank and writes the same summaries and
status; recovery/outcome.py says how the job ended. What another controller would need to
take over is kept in the run record as it goes (following/handover.py; `orchestrator
attach`). Under --max-restarts a failing rank is a restart (torchrun starts the workers
again, the job goes on) until a node's torchrun gives up, as on SSH nodes. A requeued job
starts a new attempt; so does, under --spares, the job submitted again after a node failure
(recovery/spares.py), and the job submitted again after a time limit or a preemption
(recovery/job_attempts.py), each with a job id of its own. Ctrl-C cancels the job (scancel) and
waits until squeue no longer lists it.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import BinaryIO

from orchestrator.agent.ranks import RankFile
from orchestrator.backends.scheduler_states import SchedulerState
from orchestrator.backends.sessions import Event
from orchestrator.console.footer import Footer
from orchestrator.console.sink import LogSink
from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator.options.supervision import Supervision
from orchestrator.record.runs import RunRecord, ended_status
from orchestrator.record.states import RankPhase, RunState
from orchestrator.slurm.batch.batch_script import SCRIPT_NAME, dial_python
from orchestrator.slurm.batch.job import SlurmJob
from orchestrator.slurm.batch.node_files import batch_output, kept_on_node
from orchestrator.slurm.control import client as slurm
from orchestrator.slurm.control.client import SlurmCommands
from orchestrator.slurm.control.parse import UNRUNNABLE, JobInfo
from orchestrator.slurm.following.cadence import Cadence
from orchestrator.slurm.following.handover import (
    Bookmarks,
    Following,
    Handover,
    Points,
    Progress,
    save_state,
)
from orchestrator.slurm.following.node_agents import NodeAgents
from orchestrator.slurm.following.stream import READ_BYTES, AttemptFiles
from orchestrator.slurm.recovery.grow_back import SlurmRegrow
from orchestrator.slurm.recovery.job_attempts import WARNING_FILE, JobAttempts, read_warning
from orchestrator.slurm.recovery.outcome import job_outcome
from orchestrator.slurm.recovery.resubmit import EndedJob, Resubmitting, next_job
from orchestrator.slurm.recovery.spares import SlurmSpares
from orchestrator.supervise import NodeState, Outcome, Supervisor, describe_exit
from orchestrator.supervise.run_loop import run_loop
from orchestrator.supervise.state import states_of
from orchestrator.supervise.stopping import signals_to
from orchestrator.supervise.time_limit import Cause


class Follower:
    """Follows one submitted job to its end; see the module docstring."""

    def __init__(
        self,
        job: SlurmJob,
        record: RunRecord,
        commands: SlurmCommands,
        job_id: int,
        base: dict,
        console: BinaryIO | None,
        color: bool,
        spares: SlurmSpares | None = None,
        fold: bool = True,
        footer: bool = True,
        supervision: Supervision | None = None,
        submit: Callable[[SlurmJob, int], int] | None = None,
        following: Following | None = None,
        points: Points | None = None,
        handover: Handover | None = None,  # attached: what the controller before had done
    ) -> None:
        self.job, self.record, self.commands, self.job_id = job, record, commands, job_id
        self.attempts = JobAttempts(job_id, job.max_resubmits, job.nnodes)
        self.first_job_dir = job.job_dir if handover is None else handover.first_job_dir
        if handover is not None:
            handover.restore_attempts(self.attempts)
        self.base, self.console, self.color, self.fold = base, console, color, fold
        self.footer = Footer.on(console) if footer else None  # once ranks run
        # --grace, --hang-timeout and --stragglers hold; the agents need no heartbeats from
        # us (the job is SLURM's), and SLURM watches the nodes.
        self.supervision = replace(supervision or Supervision(), heartbeat_timeout=0)
        self.agents: NodeAgents | None = None  # the node agents of the attempt followed
        self.events: queue.Queue[Event | None] = queue.Queue()  # the attempt's; None: wake
        self.judged_cancelled = False  # cancelled for a hang or a path that drops
        self.sink = LogSink(record.logs_dir, {}, {}, console, color, fold=fold)
        self.sup: Supervisor | None = None
        self.info = JobInfo(state="PENDING")
        self.files: AttemptFiles | None = None
        self.batch = RankFile(-1, str(record.path / f"slurm-{job_id}.out"))
        # What another controller would need to take over (following/handover.py).
        self.following, self.bookmarks = following, Bookmarks(record, points)
        if points is not None and points.job_id == job_id:
            self.batch.seek(points.batch)
        self.attempt = 0  # SLURM's restart count of the job followed (its attempt<restart>/)
        self.signals: list[int] = []
        self.interrupted_by: int | None = None
        self.started = time.monotonic()
        self.cadence = Cadence()
        self.spares = spares
        self.regrow = SlurmRegrow(commands, supervision) if job.min_nodes else None
        means = (self.attempts, submit, self.first_job_dir, self.note, self.base.update)
        self.resubmitting = Resubmitting(*means, spares, self.regrow)  # resubmit.next_job's
        self.hosts: list[str] = []  # the nodes of the job now followed, once it runs
        self.squeue = slurm.Squeue(commands)
        self.came = False  # the last pass's files had something
        self.result: Outcome | None = None  # how the run ended: the loop is over

    # --- output -------------------------------------------------------------------------

    def note(self, text: str) -> None:
        self.sink.note(text)
        self.sink.flush()
        if self.following is not None:  # a line of ours is never read again: keep it
            self.bookmarks.save(self)

    def write_status(self, sup: Supervisor | None = None, **extra: object) -> None:
        sup = sup or self.sup
        running = self.info.scheduler_state.on_nodes
        state = RunState.RUNNING if running else RunState.QUEUED
        if (sup is not None and sup.stopping) or self.interrupted_by:
            state = RunState.STOPPING
        self.record.write_status(
            {
                **self.base,
                "state": state,
                "slurm_state": self.info.state,
                **self.attempts.status(),
                **(sup.status() if sup else {}),
                **extra,
            }
        )
        if self.following is not None:
            kept = (self.job, self.job_id, self.first_job_dir, self.base, self.attempts)
            save_state(self.record, self.following, Progress(*kept, self.spares))

    # --- the loop -----------------------------------------------------------------------

    def run(self) -> int:
        try:
            with signals_to(self) if self.console is not None else contextlib.nullcontext():
                run_loop(self)
        except OrchestratorError as exc:
            self.sink.end_footer()
            self.note(f"error: {exc}")
            self.sink.close()
            self.write_status(**ended_status(RunState.FAILED, exc.exit_code, str(exc)))
            raise
        finally:
            if self.agents is not None:
                self.agents.leave()
        outcome = self.result
        assert outcome is not None  # the loop ends once it is known
        elapsed = time.monotonic() - self.started
        self.sink.end_footer()
        for line in outcome.closing_lines(self.job.run_id, elapsed, self.record.logs_dir):
            self.note(line)
        self.sink.close()
        self.write_status(**ended_status(outcome.state, outcome.exit_code, outcome.summary or None))
        return outcome.exit_code

    # --- what the one loop asks of its watch (orchestrator.supervise.run_loop) --------

    def current(self) -> Supervisor | None:
        """The supervisor of the attempt followed; none while the job is queued."""
        return self.sup

    def over(self) -> bool:
        return self.result is not None

    def pause(self, now: float) -> float:
        return self.cadence.pause(now)

    def before(self, now: float) -> None:
        """Signals to the orchestrator (scancel), squeue when it is due, and the files."""
        self._handle_signals()
        if self.cadence.squeue_now(now, self.sup):
            self._on_info(self.squeue.query(self.job_id, self.info, now))
        self.came = self._read()

    def hear(self, sup: Supervisor, event: Event) -> None:
        """A node agent's frame: the ranks' and nodes' ends to this follower's judgement
        (SLURM ends the step), the rest to the frame handlers as over SSH."""
        assert self.agents is not None  # events come from the agents alone
        self.agents.hand_on(sup, event, self, not self.info.ended)

    def after(self, handled: int) -> None:
        """After the supervisor's pass: the job cancelled for a hang or a path that drops,
        a slow node's warning kept, and once the job ended, the next job of the run or the
        outcome."""
        if self.sup is not None:
            self._judge(self.sup)
            if self.resubmitting.warned_for_slow(self.sup):  # the ranks' ends are stops
                self.write_status()
        self.cadence.files_read(self.came or handled > 0 or self.sink.holding())
        self.sink.flush()
        if self.following is not None:
            self.bookmarks.save(self)
        if self.info.ended:
            self._drain()
            if not self._resubmitted():
                self.result = self._outcome()

    def interrupt(self, signum: int) -> None:
        """Called from a signal handler (signals_to): only note it; the loop acts on it."""
        self.signals.append(signum)

    def wake(self) -> None:
        """Wake the loop now (after a signal; from another thread than the handler's)."""
        self.events.put(None)

    def _handle_signals(self) -> None:
        while self.signals:
            signum = self.signals.pop(0)
            name = signal.Signals(signum).name
            if self.interrupted_by is None:
                self.interrupted_by = signum
                self.note(
                    f"{name}: cancelling SLURM job {self.job_id} (scancel: SIGTERM to "
                    "every process, SIGKILL after SLURM's KillWait); Ctrl-C again to kill "
                    "at once"
                )
                slurm.cancel(self.commands, self.job_id)
            else:
                self.note(f"{name} again: killing SLURM job {self.job_id} now")
                slurm.cancel(self.commands, self.job_id, kill=True)
            if self.sup is not None and not self.sup.stopping:
                self.sup.begin_stop(self.supervision.grace, f"{name} to the orchestrator")
            self.write_status()

    def _on_info(self, info: JobInfo) -> None:
        old, self.info = self.info, info
        if info.scheduler_state == SchedulerState.QUEUED and info.reason in UNRUNNABLE:
            slurm.cancel(self.commands, self.job_id)
            raise ConfigError(
                f"SLURM will not start job {self.job_id}: {info.reason} (it "
                f"{UNRUNNABLE[info.reason]}); cancelled it. Script: "
                f"{self.record.path / SCRIPT_NAME}"
            )
        running = info.scheduler_state.on_nodes or (info.ended and info.nodelist)
        if self.sup is not None and info.scheduler_state.waiting:
            self._drain()
            self.note(f"SLURM job {self.job_id} requeued: {info.state} ({info.reason})")
            self.note(self.attempts.requeued(info.state, info.reason))
            self._close_attempt()
        if running and self.sup is None:
            self._open_attempt(info)
            self.attempts.running(self.hosts, self.job.world_size)
        if (old.state, old.reason) != (info.state, info.reason):
            where = f" on {info.nodelist}" if info.nodelist and not info.ended else ""
            why = f" ({info.reason})" if info.reason and info.reason != "None" else ""
            self.note(f"SLURM job {self.job_id}: {info.state}{why}{where}")
            self.write_status()

    def _open_attempt(self, info: JobInfo) -> None:
        """Nodes are allocated: learn their names and get ready to tail their files."""
        job = self.job
        details = slurm.job_details(self.commands, self.job_id)
        hosts = slurm.hosts_of(self.commands, info.nodelist or details.nodelist, job.nnodes)
        self.hosts = hosts
        if self.spares is not None:
            self.spares.running(hosts, self.note)
            self.base.update(self.spares.status())
        self._close_attempt()
        self.files = AttemptFiles(
            Path(job.job_dir or "") / f"attempt{details.restarts}", job.nnodes, job.nproc
        )
        self.attempt, start = details.restarts, self.bookmarks.start(self.job_id, details.restarts)
        self.files.resume(start.files or {})
        n = job.nproc
        states = states_of((host, range(k * n, (k + 1) * n)) for k, host in enumerate(hosts))
        self.sink.close()
        self.bookmarks.keep_sizes(self.sink)
        self.sink = LogSink(
            self.record.logs_dir,
            states.rank_labels,
            states.node_labels,
            self.console,
            self.color,
            fold=self.fold,
            footer=self.footer,
        )
        master = f"{job.master_addr or hosts[0]}:{job.port_of(self.job_id)}"
        self.base.update(master=master, slurm_restarts=self.attempt)
        self.events = queue.Queue()
        agents = NodeAgents(
            self.job_id,
            self.attempt,
            dial_python(job),
            self.bookmarks,
            self.events,
            self.commands,
            kept_on_node(job, self.attempt),  # where the record is not shared
        )
        self.sup = Supervisor(
            states.nodes,
            states.ranks,
            agents.sessions,
            self.events,
            self.sink,
            self.supervision,
            stop_on_failure=False,
            max_restarts=job.max_restarts,
            on_change=lambda sup: self.write_status(sup),
            metrics_path=self.record.metrics_path,
            record_dir=self.record.path,
            lose_one=partial(self.spares.lose_one, job) if self.spares is not None else None,
        )
        self.sup.deadline.signal_known(job.signal_name)  # a checkpoint asked: --signal's
        self.bookmarks.restore(self.sup, start)  # what a follower before this one knew
        if self.attempts.preempted_seen:  # warned before this attempt's ranks were followed
            self.sup.deadline.warned_for(Cause.PREEMPTION)
        self.agents = agents  # through srun here, or on the --login node
        agents.reach(hosts, start.agents)
        self.cadence.reached(agents.sessions)
        if self.interrupted_by is not None:
            self.sup.begin_stop(
                self.supervision.grace,
                f"{signal.Signals(self.interrupted_by).name} to the orchestrator",
            )

    def _close_attempt(self) -> None:
        """The attempt followed ended (requeued, or a new job submitted): its files are done."""
        if self.files is not None:
            self.files.close()
        if self.agents is not None:
            self.agents.leave()
        self.files, self.sup, self.agents = None, None, None

    # --- files --------------------------------------------------------------------------

    def _read(self) -> bool:
        """The batch script's new output and, once nodes run, the warning file, growing
        back (--min-nodes) and, where the agents are not reached, what the nodes' files
        say. Whether anything came."""
        lines = self.batch.read_lines(READ_BYTES).decode(errors="replace").splitlines()
        for line in lines:
            self.sink.note(f"batch: {line}")
        came = bool(lines)
        if self.sup is not None and self.files is not None:
            self._check_warning()  # first: a rank's exit after it is a stop
            if self.regrow is not None:  # --min-nodes: a lost node back (recovery/grow_back.py)
                self.regrow.check(self)
            if not self.job.node_side and (self.agents is None or self.agents.unreached):
                only = None if self.agents is None else self.agents.unreached
                came |= self.files.pump(
                    self.sink, self.sup, self.rank_exited, self.node_exited, only
                )
        return came

    def _drain(self) -> None:
        """Before the attempt followed closes (its job ended or was requeued): what is
        left in the files and of the agents' frames, every one."""
        self._read()
        if self.sup is not None:
            self.sup.step(None, self.hear, drain=True)
            self._judge(self.sup)
        self.sink.flush()
        if self.following is not None:
            self.bookmarks.save(self)

    def _judge(self, sup: Supervisor) -> None:
        """After the agents' frames (the stacks' rounds, `orchestrator stacks` requests and
        hang checks ran in the supervisor's pass): a channel that closed dialled again; a
        hang found, or a node that cannot reach another (U), is said, and the job
        cancelled: it ends `hung` or `unreachable`."""
        if self.agents is not None:
            self.agents.redial(sup, not self.info.ended)
        why = "it hangs" if sup.hang is not None else None
        if sup.detector.unreachable_lines:
            why = "a node cannot reach another"
        if why is not None and not self.judged_cancelled:
            self.judged_cancelled = True
            self.note(f"cancelling SLURM job {self.job_id}: {why} (scancel)")
            slurm.cancel(self.commands, self.job_id)

    def _check_warning(self) -> None:
        """The script's warning file: the ranks were sent the time limit's (or a
        preemption's) signal; said once per attempt."""
        if self.files is None or self.job.node_side or self.attempts.current.warned_at is not None:
            return
        warning = read_warning(Path(self.files.attempt_dir) / WARNING_FILE)
        if warning is None:
            return
        self.warned(*warning)

    def warned(self, signal_name: str, when: float) -> None:
        """The ranks were sent the time limit's (or a preemption's) signal: said once per
        attempt (the batch script's warning file, or a node agent's G frame)."""
        if self.attempts.current.warned_at is not None:
            return
        preempted = slurm.job_details(self.commands, self.job_id).preempted
        self.note(self.attempts.warned(signal_name, when, preempted))
        if self.sup is not None:  # the ranks that end on it are named with what it was for
            self.sup.deadline.warned_for(Cause.PREEMPTION if preempted else Cause.TIME_LIMIT)
        self.write_status()
        self.cadence.poll_now()

    def channel_closed(self, node: int) -> None:
        """A node agent's channel closed: squeue at once (the job may have ended)."""
        self.cadence.channel_closed(node)

    def rank_exited(
        self, rank: int, code: int, when: float, after_stop: bool | None = None
    ) -> None:
        """A rank ended (a node agent's E frame, or its exit file)."""
        sup = self.sup
        assert sup is not None
        # After the warning a rank's end is its stop (the trainer exits 138), never a failure.
        warned = self.attempts.current.warned_at is not None and code != 0
        sup.rank_exited(rank, code, when, after_stop, warned)
        self.cadence.poll_now()  # the job may be ending: squeue says so
        # "restarting" (--max-restarts): torchrun starts the workers again, the job goes on.
        if sup.ranks[rank].state == RankPhase.FAILED and not sup.stopping:
            host = sup.ranks[rank].host
            self.note(
                f"rank {rank} on {host} ended with {describe_exit(code)}; srun ends the "
                "job step on every node (--kill-on-bad-exit)"
            )
            sup.scheduler_stopped(f"rank {rank} on {host} failed", at=when)

    def node_exited(self, node: NodeState, code: int | None, when: float) -> None:
        """A node's part ended (its agent's X frame, or its exit file)."""
        sup = self.sup
        assert sup is not None
        sup.node_exited(node, code, when)
        if code != 0 and not sup.stopping and self.job.max_restarts:
            self.note(
                f"{node.host}: torchrun gave up ({describe_exit(code)}, --max-restarts "
                f"{self.job.max_restarts} spent); srun ends the job step on every node"
            )
            sup.scheduler_stopped(f"{node.host} failed", at=when)

    def _resubmitted(self) -> bool:
        """After the job ended: follow the next job of the run, submitted again after a
        node failure (--spares), a time limit or a preemption (recovery/job_attempts.py), if any."""
        if self.interrupted_by is not None:
            self.attempts.ended("CANCELLED", False)
            return False
        ended = (self.job_id, self.info)
        sup = self.sup
        ranks_ok = sup is not None and all(r.exit_code == 0 for r in sup.ranks.values())
        if (
            self.info.scheduler_state not in (SchedulerState.SUCCEEDED, SchedulerState.CANCELLED)
            and slurm.job_details(self.commands, self.job_id).preempted
        ):  # the ranks stopped on SLURM's SIGTERM or --signal, the script ended first
            self.attempts.preempted()
        self.attempts.ended(self.info.state, ranks_ok)
        last = EndedJob(
            self.job, self.job_id, self.info, self.hosts, self.sup, Path(self.batch.path)
        )
        new = next_job(last, self.resubmitting, len(self.attempts.entries) + 1)
        if new is None:
            return False
        self.job, self.job_id = new
        self.batch = RankFile(-1, str(self.record.path / f"slurm-{self.job_id}.out"))
        self._close_attempt()
        self.info, self.hosts = JobInfo(state="PENDING"), []
        self.base.update(slurm_job_id=new[1], nnodes=new[0].nnodes, world_size=new[0].world_size)
        self.base.setdefault("slurm_job_ids", [ended[0]]).append(self.job_id)
        self.write_status()
        return True

    def _outcome(self) -> Outcome:
        on_node = batch_output(self.job, self.job_id) if self.job.node_side else None
        files, sup = self.files, self.sup
        succeeded = self.info.scheduler_state == SchedulerState.SUCCEEDED
        if on_node is None and files and sup and succeeded:
            files.settle(sup, self.rank_exited, self.node_exited)  # see settle
        outcome = job_outcome(
            self.job_id, self.info, self.sup, self.interrupted_by, Path(self.batch.path), on_node
        )
        outcome = self.spares.amend(outcome) if self.spares is not None else outcome
        return self.attempts.amend(outcome)
