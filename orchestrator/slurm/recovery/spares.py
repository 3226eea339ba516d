"""`launch --backend slurm --spares N`: a failed node is replaced by submitting the job again.

SLURM ends a job whose node fails (NODE_FAIL, once slurmctld has not heard from the node's
slurmd for SlurmdTimeout and marks it DOWN); the script asks `--no-requeue`, so SLURM does
not requeue it in place. The follower then asks SLURM which of the job's nodes is down or
not responding, puts it on the bad-node list (--bad-nodes) and submits the same job again
(same run id, same command) without it, up to N times: with a hostfile, the next of the
last N hosts (held back) takes its place in the node list; without one, the failed node
goes into `--exclude` and SLURM chooses another from the partition. A job that ends by its
own error (a rank's exit 3: FAILED, every node up) uses no spare.

Why not within one allocation (nodes+N with --no-kill, srun steps on the healthy ones):
the batch script lives on the first node, so that node's failure ends the job anyway, and
the step's end does not say which node failed before SLURM marks it DOWN; resubmission
treats every node alike, needs no idle extra nodes held for the whole run, and gives the
replacement a job of its own (new id: no requeue hold, `cred_expire`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from orchestrator.attempts.next_attempt import AttemptEnd, Next, next_attempt
from orchestrator.backends.scheduler_states import SchedulerState
from orchestrator.errors import ConfigError
from orchestrator.record.bad_nodes import add_bad_node
from orchestrator.record.recoveries import Recovery
from orchestrator.record.states import RunState
from orchestrator.record.world import floor_line, going_on_line
from orchestrator.slurm.batch.job import SlurmJob
from orchestrator.slurm.control.client import SlurmCommands
from orchestrator.slurm.control.parse import JobInfo, parse_sinfo_down
from orchestrator.slurm.recovery.shrink import shrunk
from orchestrator.supervise import Outcome
from orchestrator.supervise.state import NodeFault

BY_SLURM = "(chosen by SLURM)"


def failed_nodes(commands: SlurmCommands, hosts: list[str]) -> list[tuple[str, str]]:
    """The nodes of `hosts` that SLURM holds down, failed or not responding, with why."""
    if not hosts:
        return []
    rc, out, _ = commands.run(["sinfo", "-h", "-N", "-n", ",".join(hosts), "-o", "%N|%T|%E"])
    found = parse_sinfo_down(out) if rc == 0 else {}
    return [(name, found[name]) for name in hosts if name in found]


def check_capacity(commands: SlurmCommands, job: SlurmJob, partition: str | None) -> None:
    """--spares N without a hostfile: the partition must have nodes+N nodes outside
    --exclude (the bad-node list), or the replacement could never start."""
    if not job.spares or job.nodelist:
        return
    argv = ["sinfo", "-h", "-N", "-o", "%N"] + (["-p", partition] if partition else [])
    rc, out, _ = commands.run(argv)
    if rc != 0:
        return  # sbatch says what is wrong with the partition
    usable = set(out.split()) - set(job.exclude)
    if job.nnodes + job.spares > len(usable):
        raise ConfigError(
            f"--spares {job.spares} with --nodes {job.nnodes}: the job may need "
            f"{job.nnodes + job.spares} nodes over its life, but partition "
            f"{partition or '(default)'} has {len(usable)} usable ("
            f"{', '.join(sorted(usable)) or 'none'}); ask for fewer spares"
        )


def job_dir_of(first: str | None, number: int) -> str | None:
    """The job folder of the run's job number `number` (1: the first, `first`)."""
    return f"{first}-{number}" if first and number > 1 else first


def resubmitted(job: SlurmJob, failed: str, job_dir: str | None) -> SlurmJob:
    """The same job without node `failed`: a hostfile's next spare takes its place in the
    node list, else SLURM chooses one, `failed` (with the earlier ones) in --exclude."""
    nodelist, spare_nodes = job.nodelist, job.spare_nodes
    if failed in nodelist and spare_nodes:
        nodelist = tuple(spare_nodes[0] if n == failed else n for n in nodelist)
        spare_nodes = spare_nodes[1:]
    exclude = job.exclude if failed in job.exclude else (*job.exclude, failed)
    moved = job.on_nodes(job.nnodes, nodelist, exclude)
    return replace(moved, spare_nodes=spare_nodes, spares=job.spares - 1, job_dir=job_dir)


class SlurmSpares:
    """The spares of one run: what failed, what replaced it, what is left; and with
    --min-nodes, once no spare is left, the job on the nodes left
    (orchestrator.slurm.recovery.shrink)."""

    def __init__(
        self,
        job: SlurmJob,
        commands: SlurmCommands,
        bad_nodes: str | None,
        submit: Callable[[SlurmJob, int], int],
    ) -> None:
        self.given = job.spares
        self.commands, self.bad_nodes, self.submit = commands, bad_nodes, submit
        self.recoveries: list[Recovery] = []
        self.unreplaced: str | None = None  # the node fault that ended the run, if any
        self.left, self.names, self.min_nodes = job.spares, job.spare_nodes, job.min_nodes
        self.run_id, self.job_dir = job.run_id, job.job_dir
        self.before: list[str] = []  # the nodes of the job that lost one
        self.failed: list[str] = []  # the nodes SLURM holds down after the job's end
        self.floor: str | None = None  # --min-nodes: fewer were left (the run ends lost)
        self.shrunk_at: float | None = None  # when the job on fewer nodes was submitted
        self.slow: set[str] = set()  # taken out for being slow: never asked back (grow_back)

    def failure(self, job_id: int, info: JobInfo, hosts: list[str]) -> tuple[str, str] | None:
        """After job `job_id` ended as `info` says: its node that failed and why, or None
        when the job ended by itself (every node up)."""
        if info.scheduler_state in (SchedulerState.SUCCEEDED, SchedulerState.CANCELLED):
            return None
        failed = failed_nodes(self.commands, hosts)
        self.failed = [name for name, _ in failed]
        if not failed:
            return None
        node, state = failed[0]
        return node, f"SLURM job {job_id} ended {info.state}: {node} is {state}"

    def after(self, job: SlurmJob) -> Next:
        """What follows `job`, whose nodes `failure` found down: a spare, the nodes left, or
        the run's end (the one decision, attempts/next_attempt.py)."""
        lost = max(1, len(self.failed))
        return next_attempt(AttemptEnd(job.nnodes, lost, job.spares, job.min_nodes))

    def lose_one(self, job: SlurmJob) -> Next:
        """What a node of `job` lost now would lead to (a slow node is taken out only while
        this goes on: supervise/straggler_swap.py)."""
        return next_attempt(AttemptEnd(job.nnodes, 1, job.spares, job.min_nodes))

    def slow_node(self, fault: NodeFault) -> tuple[str, str]:
        """The slow node the ended job stopped at its checkpoint for: taken out as a failed
        one is (`replace`), and never asked back."""
        self.failed = [fault.host]
        self.slow.add(fault.host)
        return fault.host, fault.why

    def replace(
        self,
        job: SlurmJob,
        hosts: list[str],
        node: str,
        why: str,
        attempt: int,
        note: Callable[[str], None],
    ) -> tuple[SlurmJob, int] | None:
        """Put the failed `node` on the bad-node list and submit the job again without it
        as the run's job number `attempt`: the new job and its id, or None when no spare
        is left; what it does is said through `note`."""
        for name in self.failed or [node]:
            self._mark_bad(name, why, note)
        step = self.after(job)
        if step is Next.SHRINK:
            return self._shrink(job, hosts, attempt, note)
        if step is not Next.SPARE:
            self.unreplaced = why
            if step is Next.FLOOR:
                lost = self.failed or [node]
                what, left = f"{', '.join(lost)} lost", job.nnodes - len(lost)
                self.floor = floor_line(what, left, job.launched_nodes, job.min_nodes)
            return None
        job_dir = job_dir_of(self.job_dir, attempt)
        new = resubmitted(job, node, job_dir)
        spare = next((n for n in new.nodelist if n not in job.nodelist), BY_SLURM)
        recovery = Recovery(attempt, hosts.index(node), node, why, spare, time.time())
        self.recoveries.append(recovery)
        self.left, self.names, self.before = new.spares, new.spare_nodes, list(hosts)
        note(
            f"attempt {attempt}: {node} taken out ({why}); submitting the job again "
            + (f"with {spare} in its place" if spare != BY_SLURM else f"with --exclude={node}")
            + f" (--spares: {new.spares} left)"
        )
        new_id = self.submit(new, attempt)
        note(f"run {job.run_id}: SLURM job {new_id} submitted (attempt {attempt})")
        return new, new_id

    def _shrink(
        self, job: SlurmJob, hosts: list[str], attempt: int, note: Callable[[str], None]
    ) -> tuple[SlurmJob, int]:
        """Submit the job again on its nodes but the failed ones (--min-nodes)."""
        new = shrunk(job, self.failed, job_dir_of(self.job_dir, attempt))
        self.before, self.shrunk_at = list(hosts), time.time()
        word = "slow" if set(self.failed) <= self.slow else "lost"
        what = f"{', '.join(self.failed)} {word}"
        note(going_on_line(what, new.nnodes, job.launched_nodes, job.min_nodes))
        new_id = self.submit(new, attempt)
        note(
            f"run {job.run_id}: SLURM job {new_id} submitted (attempt {attempt}) on "
            f"{new.nnodes} node(s), without {', '.join(self.failed)}"
        )
        return new, new_id

    def running(self, hosts: list[str], note: Callable[[str], None]) -> None:
        """The newest job runs on `hosts`: the last recovery (or shrink) is complete."""
        if self.shrunk_at is not None:
            note(
                f"running again on {len(hosts)} node(s) ({', '.join(hosts)}), "
                f"{time.time() - self.shrunk_at:.1f} s after the failure was seen (--min-nodes)"
            )
            self.shrunk_at = None
        if self.recoveries and self.recoveries[-1].running_at is None:
            recovery = self.recoveries[-1]
            spare = recovery.spare
            if spare == BY_SLURM:
                spare = next((h for h in hosts if h not in self.before), BY_SLURM)
            recovery = self.recoveries[-1] = replace(recovery, running_at=time.time(), spare=spare)
            note(
                f"attempt {recovery.attempt}: running again on {', '.join(hosts)}, "
                f"{recovery.running_at - recovery.noticed_at:.1f} s after the failure was seen"
            )

    def restore(
        self, recoveries: list[Recovery], unreplaced: str | None, left: int, before: list[str]
    ) -> None:
        """The spares as a follower before this one left them (following/handover.py)."""
        self.recoveries, self.unreplaced, self.left, self.before = (
            recoveries,
            unreplaced,
            left,
            before,
        )

    def status(self) -> dict:
        """The recovery part of status.json."""
        return {
            "spares": list(self.names),
            "spares_left": self.left,
            "recoveries": [r.to_dict() for r in self.recoveries],
            **({"min_nodes": self.min_nodes} if self.min_nodes else {}),
        }

    def amend(self, outcome: Outcome) -> Outcome:
        """The final outcome with the recoveries, and why no spare replaced a failed node."""
        lines = [outcome.summary] if outcome.summary else []
        if self.floor:
            lines.append(self.floor)
            outcome = replace(outcome, state=RunState.LOST, exit_code=1)
        elif self.unreplaced:
            lines.append(f"no spare left to replace it: --spares {self.given} used up")
        if self.recoveries:
            lines.append(f"recovered from {len(self.recoveries)} node failure(s) (--spares):")
            lines += [f"  {recovery.describe()}" for recovery in self.recoveries]
        return replace(outcome, summary="\n".join(lines))

    def _mark_bad(self, host: str, why: str, note: Callable[[str], None]) -> None:
        if not self.bad_nodes:
            return
        try:
            add_bad_node(self.bad_nodes, host, self.run_id, why)
        except OSError as exc:
            note(f"warning: cannot add {host} to the bad-node list {self.bad_nodes}: {exc}")
            return
        note(f"{host} added to the bad-node list {self.bad_nodes}")
