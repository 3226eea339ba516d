"""`launch --backend slurm --min-nodes K` growing back: while the run goes on with fewer nodes
than it was launched with, the follower asks SLURM now and then (every 30 s, or twice
--heartbeat-timeout if less, as over SSH) whether a node the run lost is idle again
(`sinfo -N -n NODES -o %N|%T`: `idle`, not `down`, `drained` or not responding). When one
is, the console says `NODE back; growing to N nodes at the next checkpoint`, the ranks get
the warning signal through their node agents (`signal USR1`, or --signal's: the path of the
time limit's warning over SSH, time_limit.WarningClock.checkpoint), the bundled trainer
saves a checkpoint and exits 138, the job ends, and the next job is submitted on the larger
count, the node no longer in `--exclude` (with a hostfile, back in the node list). Never
more nodes than launched; the job that grew ends `grow` in `attempts`, and `world` shows the
larger world.

Which nodes are asked: only those the run lost (the nodes in the job's `--exclude` that
were not excluded at launch: the job keeps the launch's, so a controller that `attach`
took over asks for the same nodes), with or without a hostfile. An idle node of the partition
that the run never ran on is not taken: it was there when the run shrank, and --spares
(given or not) had said how many other nodes the run may take; taking it later would be a
spare beyond --spares, and a run on a busy partition would restart each time a node comes
free. A node added to the partition later cannot be told from one idle all along.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from orchestrator.options.supervision import Supervision
from orchestrator.slurm.batch.job import SlurmJob
from orchestrator.slurm.control.client import SlurmCommands
from orchestrator.slurm.control.parse import JobInfo, parse_sinfo_idle
from orchestrator.slurm.recovery.job_attempts import JobAttempts
from orchestrator.slurm.recovery.spares import SlurmSpares
from orchestrator.supervise import Supervisor

GROW = "grow"  # the ending of a job stopped at a checkpoint to grow back (attempts)


class Followed(Protocol):
    """What of the follower (following/follow.py) growing back reads and uses."""

    job: SlurmJob
    info: JobInfo
    sup: Supervisor | None
    attempts: JobAttempts
    spares: SlurmSpares | None

    def note(self, text: str) -> None: ...

    def write_status(self) -> None: ...


def lost_nodes(job: SlurmJob) -> list[str]:
    """The nodes the run lost since launch: in the job's --exclude, not in the launch's
    (the job keeps that, so a follower that attached later asks for the same nodes)."""
    return [name for name in job.exclude if name not in job.launch_exclude]


def coming_back(job: SlurmJob, lost: Sequence[str], idle: Sequence[str]) -> list[str]:
    """The lost nodes that may join the next job: those idle again, as many as the job is
    short of the nodes it was launched with."""
    room = job.launched_nodes - job.nnodes
    return [name for name in lost if name in idle][: max(0, room)]


def grown(job: SlurmJob, back: Sequence[str], job_dir: str | None) -> SlurmJob:
    """The same job with `back` again: one node more for each, out of --exclude, and with a
    hostfile back in the node list; the same command and environment."""
    nodelist = (*job.nodelist, *back) if job.nodelist else ()
    exclude = tuple(name for name in job.exclude if name not in back)
    return replace(job.on_nodes(job.nnodes + len(back), nodelist, exclude), job_dir=job_dir)


def idle_nodes(commands: SlurmCommands, names: Sequence[str]) -> list[str]:
    """Those of `names` that SLURM holds idle (could give a job now); [] when sinfo fails."""
    if not names:
        return []
    rc, out, _ = commands.run(["sinfo", "-h", "-N", "-n", ",".join(names), "-o", "%N|%T"])
    idle = parse_sinfo_idle(out) if rc == 0 else set()
    return [name for name in names if name in idle]


class SlurmRegrow:
    """Asks SLURM for the lost nodes of one run and, when one is back, has the ranks
    checkpoint; the next job is then the larger one (`take`; resubmit.next_job submits it)."""

    def __init__(self, commands: SlurmCommands, supervision: Supervision | None) -> None:
        self.commands = commands
        self.every = (supervision or Supervision()).ask_again_every
        self.asked_at = time.monotonic()
        self.back: list[str] = []  # the nodes the next job takes back (the signal is due)
        self.signalled = False  # the ranks were sent the warning for `back`
        self.sent_at = 0.0  # when (monotonic)

    def check(self, f: Followed) -> None:
        """Called on every pass of the loop (before the supervisor's) while the job runs:
        ask SLURM when it is time, and send the ranks the warning once a node is back."""
        sup, attempt = f.sup, f.attempts.current
        if sup is None or sup.stopping or f.info.ended:
            return
        if self.signalled:
            self._unheard(f, sup)
            return
        if attempt.warned_at is not None:  # the time limit's (or a preemption's) warning
            return
        if not self.back:
            now = time.monotonic()
            slow = f.spares.slow if f.spares is not None else set()
            lost = [name for name in lost_nodes(f.job) if name not in slow]  # still slow
            if not lost or f.job.nnodes >= f.job.launched_nodes or now - self.asked_at < self.every:
                return
            self.asked_at = now
            self.back = coming_back(f.job, lost, idle_nodes(self.commands, lost))
            if not self.back:
                return
            size = f.job.nnodes + len(self.back)
            f.note(f"{', '.join(self.back)} back; growing to {size} nodes at the next checkpoint")
        size = f.job.nnodes + len(self.back)
        sup.deadline.signal_known(f.job.signal_name)
        if sup.deadline.checkpoint(sup, sup.sink, time.time(), f"growing to {size} nodes"):
            # the ranks' ends from now on are stops
            f.attempts.warned_to(f"SIG{sup.deadline.signal_name} to grow to {size} nodes")
            self.signalled, self.sent_at = True, time.monotonic()
            f.write_status()

    def _unheard(self, f: Followed, sup: Supervisor) -> None:
        """No rank took the warning (every node that answered says its ranks do not catch
        it yet: a program still starting): send it again after the interval."""
        clock = sup.deadline
        if clock.ranks_signalled or not clock.not_catching:
            return
        if time.monotonic() - self.sent_at < self.every:
            return
        clock.unsent()
        f.attempts.unwarned()
        self.signalled = False

    def take(self) -> list[str]:
        """The nodes the ended job was stopped for (the warning sent), [] when none; the
        growth under way ends here, whatever follows."""
        back, self.back, signalled, self.signalled = self.back, [], self.signalled, False
        return back if signalled else []
