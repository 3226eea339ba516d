"""Following a submitted SLURM job to its end, as `launch --backend slurm` shows it.

squeue says queued/running; once nodes run, each node's files under
`<run>/nodes/attempt<restart>/node<K>/` (rank-R.out/.exit, node.out/.start/.exit, written
by the sbatch script on the shared file system) are tailed into the same `LogSink` the SSH
path uses, and rank and node exits drive a `Supervisor` without sessions (SLURM stops the
nodes: srun --kill-on-bad-exit, scancel), which decides the first failing rank and writes
the same summaries and status. A requeued job starts a new attempt. Ctrl-C cancels the
job (scancel) and waits until squeue no longer lists it.
"""

from __future__ import annotations

import os
import queue
import signal
import time
from pathlib import Path
from typing import BinaryIO

from orchestrator.agent.ranks import RankFile
from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator.logs import LogSink, last_lines_of
from orchestrator.runs import RunRecord, now_iso
from orchestrator.slurm import commands as slurm
from orchestrator.slurm.commands import JobInfo, SlurmCommands
from orchestrator.slurm.render import PORT_BASE, PORT_SPAN, SCRIPT_NAME, SlurmJob
from orchestrator.supervise import NodeState, Outcome, RankState, Supervisor, describe_exit

POLL_S = 1.0  # squeue at most this often
FILES_S = 0.1  # rank files this often
UNREACHABLE_GRACE_S = 120.0  # how long squeue may fail before the launcher gives up
JOB_ENDINGS = {
    "TIMEOUT": "it reached its time limit (--time)",
    "CANCELLED": "it was cancelled (scancel)",
    "NODE_FAIL": "a node of it failed",
    "PREEMPTED": "it was preempted",
    "OUT_OF_MEMORY": "it ran out of memory",
    "DEADLINE": "it reached its deadline",
    "BOOT_FAIL": "a node failed to boot",
}


class Follower:
    """Follows one submitted job to its end; see the module docstring."""

    def __init__(self, job: SlurmJob, record: RunRecord, commands: SlurmCommands, job_id: int,
                 base: dict, console: BinaryIO | None, color: bool) -> None:
        self.job, self.record, self.commands, self.job_id = job, record, commands, job_id
        self.base, self.console, self.color = base, console, color
        self.sink = LogSink(record.logs_dir, {}, {}, console, color)
        self.sup: Supervisor | None = None
        self.info = JobInfo(state="PENDING")
        self.attempt_dir: Path | None = None
        self.rank_files: dict[int, RankFile] = {}
        self.node_files: dict[int, RankFile] = {}
        self.exited: set[int] = set()
        self.batch = RankFile(-1, str(record.path / f"slurm-{job_id}.out"))
        self.signals: list[int] = []
        self.interrupted_by: int | None = None
        self.started = time.monotonic()

    # --- output -------------------------------------------------------------------------

    def note(self, text: str) -> None:
        self.sink.note(text)
        self.sink.flush()

    def write_status(self, sup: Supervisor | None = None, **extra: object) -> None:
        sup = sup or self.sup
        state = "queued" if self.info.state not in ("RUNNING", "COMPLETING") else "running"
        if (sup is not None and sup.stopping) or self.interrupted_by:
            state = "stopping"
        self.record.write_status({**self.base, "state": state, "slurm_state": self.info.state,
                                  **(sup.status() if sup else {}), **extra})

    # --- the loop -----------------------------------------------------------------------

    def run(self) -> int:
        previous = {}
        if self.console is not None:
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[signum] = signal.signal(signum, lambda n, _f: self.signals.append(n))
        try:
            outcome = self._loop()
        except OrchestratorError as exc:
            self.note(f"error: {exc}")
            self.sink.close()
            self.write_status(state="failed", exit_code=exc.exit_code, ended_at=now_iso(),
                              summary=str(exc))
            raise
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        elapsed = time.monotonic() - self.started
        if outcome.state == "succeeded":
            self.note(f"run {self.job.run_id} succeeded in {elapsed:.1f} s")
        else:
            self.note(outcome.summary)
            self.note(f"run {self.job.run_id} {outcome.state} (exit code {outcome.exit_code}) "
                      f"after {elapsed:.1f} s; logs in {self.record.logs_dir}")
        self.sink.close()
        self.write_status(state=outcome.state, exit_code=outcome.exit_code,
                          ended_at=now_iso(), summary=outcome.summary or None)
        return outcome.exit_code

    def _loop(self) -> Outcome:
        last_poll, failing_since = 0.0, None
        while True:
            self._handle_signals()
            now = time.monotonic()
            if now - last_poll >= POLL_S:
                last_poll = now
                try:
                    info = slurm.query(self.commands, self.job_id)
                    failing_since = None
                except ConfigError:
                    raise
                except OrchestratorError as exc:  # e.g. the controller restarting: retry
                    failing_since = failing_since or now
                    if now - failing_since > UNREACHABLE_GRACE_S:
                        raise OrchestratorError(f"{exc}; SLURM job {self.job_id} may still "
                                                "run: `orchestrator status` asks again") from None
                    info = self.info
                self._on_info(info)
            self._pump()
            if self.info.ended:
                self._pump()
                return self._outcome()
            time.sleep(FILES_S)

    def _handle_signals(self) -> None:
        while self.signals:
            signum = self.signals.pop(0)
            name = signal.Signals(signum).name
            if self.interrupted_by is None:
                self.interrupted_by = signum
                self.note(f"{name}: cancelling SLURM job {self.job_id} (scancel: SIGTERM to "
                          "every process, SIGKILL after SLURM's KillWait); Ctrl-C again to kill "
                          "at once")
                slurm.cancel(self.commands, self.job_id)
            else:
                self.note(f"{name} again: killing SLURM job {self.job_id} now")
                slurm.cancel(self.commands, self.job_id, kill=True)
            if self.sup is not None and not self.sup.stopping:
                self.sup.begin_stop(0, f"{name} to the orchestrator")
            self.write_status()

    def _on_info(self, info: JobInfo) -> None:
        old, self.info = self.info, info
        if info.state == "PENDING" and info.reason in slurm.UNRUNNABLE:
            slurm.cancel(self.commands, self.job_id)
            raise ConfigError(f"SLURM will not start job {self.job_id}: {info.reason} (it "
                              f"{slurm.UNRUNNABLE[info.reason]}); cancelled it. Script: "
                              f"{self.record.path / SCRIPT_NAME}")
        running = info.state in ("RUNNING", "COMPLETING") or (info.ended and info.nodelist)
        if self.sup is not None and (info.state == "PENDING" or info.state.startswith("REQUEUE")):
            self._pump()
            self.note(f"SLURM job {self.job_id} requeued: {info.state} ({info.reason})")
            self.sup = None
        if running and self.sup is None:
            self._open_attempt(info)
        if (old.state, old.reason) != (info.state, info.reason):
            where = f" on {info.nodelist}" if info.nodelist and not info.ended else ""
            why = f" ({info.reason})" if info.reason and info.reason != "None" else ""
            self.note(f"SLURM job {self.job_id}: {info.state}{why}{where}")
            self.write_status()

    def _open_attempt(self, info: JobInfo) -> None:
        """Nodes are allocated: learn their names and get ready to tail their files."""
        job = self.job
        details = slurm.job_details(self.commands, self.job_id)
        nodelist = info.nodelist or details.nodelist
        try:
            hosts = slurm.expand_nodelist(self.commands, nodelist)
        except OrchestratorError:
            hosts = []
        if len(hosts) != job.nnodes:
            hosts = [f"node{k}" for k in range(job.nnodes)]
        self.attempt_dir = Path(job.job_dir or "") / f"attempt{details.restarts}"
        for old in [*self.rank_files.values(), *self.node_files.values()]:
            if old.fd is not None:  # the previous attempt's files
                os.close(old.fd)
        self.rank_files, self.node_files = {}, {}
        nodes, ranks, labels = [], [], {}
        for k, host in enumerate(hosts):
            node_ranks = range(k * job.nproc, (k + 1) * job.nproc)
            nodes.append(NodeState(index=k, host=host, ranks=tuple(node_ranks)))
            for local, rank in enumerate(node_ranks):
                ranks.append(RankState(rank, k, local, host))
                labels[rank] = f"{host} r{rank}"
                self.rank_files[rank] = RankFile(rank, str(self._node_dir(k) /
                                                           f"rank-{rank}.out"))
            self.node_files[k] = RankFile(k, str(self._node_dir(k) / "node.out"))
        self.exited = set()
        self.sink.close()
        self.sink = LogSink(self.record.logs_dir, labels, dict(enumerate(hosts)), self.console,
                            self.color)
        port = job.master_port or PORT_BASE + self.job_id % PORT_SPAN
        self.base.update(master=f"{job.master_addr or hosts[0]}:{port}",
                         attempt=details.restarts)
        self.sup = Supervisor(nodes, ranks, [], queue.Queue(), self.sink, grace=0,
                              heartbeat_timeout=0, stop_on_failure=False,
                              on_change=lambda sup: self.write_status(sup))
        if self.interrupted_by is not None:
            self.sup.begin_stop(0, f"{signal.Signals(self.interrupted_by).name} to the "
                                "orchestrator")

    def _node_dir(self, k: int) -> Path:
        assert self.attempt_dir is not None
        return self.attempt_dir / f"node{k}"

    # --- files --------------------------------------------------------------------------

    def _pump(self) -> None:
        """Pass on new output; record node starts, rank exits and node exits."""
        batch = self.batch.read_lines(1 << 20)
        for line in batch.decode(errors="replace").splitlines():
            self.sink.note(f"batch: {line}")
        if self.sup is None:
            self.sink.flush()
            return
        sup = self.sup
        for rank, rank_file in self.rank_files.items():
            if data := rank_file.read_lines(1 << 20):
                self.sink.rank_output(rank, data)
        for node in sup.nodes:
            if node.state == "starting" and (start := _read_line(self._node_dir(node.index) /
                                                                  "node.start")):
                node.state, node.started_at = "running", float(start[1])
                for rank in node.ranks:
                    sup.ranks[rank].state = "running"
                sup.on_change(sup)
            if data := self.node_files[node.index].read_lines(1 << 20):
                self.sink.node_output(node.index, data)
        ended = []
        for rank, rank_file in self.rank_files.items():
            fields = None if rank in self.exited else _read_line(
                self._node_dir(sup.ranks[rank].node) / f"rank-{rank}.exit")
            if fields and rank_file.at_end():
                self.sink.rank_output(rank, rank_file.rest())
                ended.append((float(fields[1]), rank, int(fields[0]), fields[2:]))
        for when, rank, code, error_file in sorted(ended):
            self.exited.add(rank)
            if error_file and os.path.isfile(error_file[0]):
                sup.ranks[rank].error_file = Path(error_file[0]).read_text(errors="replace")
            self._rank_exited(rank, code, when)
        for node in sup.nodes:
            if not node.done and (fields := _read_line(self._node_dir(node.index) /
                                                       "node.exit")):
                self.sink.node_output(node.index, self.node_files[node.index].rest())
                sup.node_exited(node, int(fields[0]), float(fields[1]))
        self.sink.flush()

    def _rank_exited(self, rank: int, code: int, when: float) -> None:
        sup = self.sup
        assert sup is not None
        sup.rank_exited(rank, code, when)
        if code != 0 and not sup.stopping:
            host = sup.ranks[rank].host
            self.note(f"rank {rank} on {host} ended with {describe_exit(code)}; srun ends the "
                      "job step on every node (--kill-on-bad-exit)")
            sup.begin_stop(0, f"rank {rank} on {host} failed")
            sup.stop_wall = when  # ranks that end after it were stopped, not failed

    # --- the end ------------------------------------------------------------------------

    def _outcome(self) -> Outcome:
        info, sup = self.info, self.sup
        if sup is not None:
            for node in sup.nodes:
                if not node.done:  # SLURM ended it before its script could say so
                    node.done, node.ended_at = True, time.time()
                    node.state = "stopped" if sup.stopping else "failed"
                    node.detail = f"ended by SLURM (job {info.state})"
                    for rank in node.ranks:
                        if sup.ranks[rank].exit_code is None:
                            sup.ranks[rank].state = "killed" if sup.stopping else "unknown"
            if self.interrupted_by is not None:
                sup.interrupted_by = self.interrupted_by
        ranks = sup.outcome() if sup is not None else None
        job_code = info.exit_code if info.exit_code else 1
        name = f"SLURM job {self.job_id}"
        if self.interrupted_by is not None:
            signame = signal.Signals(self.interrupted_by).name
            return Outcome("stopped", 128 + self.interrupted_by,
                           f"stopped by {signame}: {name} cancelled")
        if info.state == "COMPLETED" and (ranks is None or ranks.state == "succeeded"):
            return Outcome("succeeded", 0)
        if info.state in JOB_ENDINGS:
            summary = f"job ended: {name} ended {info.state}: {JOB_ENDINGS[info.state]}"
            if ranks is not None and ranks.summary:
                summary += "\n" + ranks.summary
            return Outcome("stopped" if info.state == "CANCELLED" else "failed", job_code,
                           summary)
        started = sup is not None and any(n.started_at is not None for n in sup.nodes)
        if ranks is not None and started and (ranks.state != "succeeded" or
                                              info.state == "UNKNOWN"):
            return ranks
        tail = [line.decode(errors="replace").rstrip("\n") for line in
                _last_lines(self.batch.path)]
        lines = [f"job failed: {name} ended {info.state} with {describe_exit(job_code)}"
                 + (" and no rank failed" if started else " before any node started its ranks")]
        if tail:
            lines += [f"last {len(tail)} line(s) of {self.batch.path}:"]
            lines += [f"  {line}" for line in tail]
        return Outcome("failed", job_code, "\n".join(lines))


def _read_line(path: Path) -> list[str] | None:
    """The fields of a one-line file the script writes (None until it is complete)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    return text.split() if text.endswith("\n") and text.strip() else None


def _last_lines(path: str, count: int = 20) -> list[bytes]:
    return last_lines_of(Path(path), count)
