"""Streaming one attempt of a SLURM job: the files its nodes write, into the LogSink, for the
nodes whose agent is not reached; the others' agents send the same (node_agents.py).

The sbatch script writes, under `<job dir>/attempt<restart>/node<K>/` on the shared file
system, each rank's output, metrics channel and exit (rank-R.out, metrics-R.jsonl,
rank-R.exit) and the node's own output, start and exit (node.out, node.start,
node.exit). `AttemptFiles.pump` tails the output as whole lines into the sink, the metrics
into the run's metrics.jsonl, and passes starts and exits on to the `Supervisor`, a rank's
exit only once all its output is on the way (as the agent does on SSH nodes). Under torchrun's
--max-restarts a rank runs again within the same attempt: its rank-R.out grows on and its
rank-R.exit is rewritten when it ends again, which is passed on as its next exit. Where the
agents are reached, a completed job's files still settle the exits of ranks and nodes that
were not heard to end (`settle`: SLURM may cancel a dial before its last frames came).

Times: the times the nodes write are in each node's own clock, which the follower cannot
measure. The files' modification times are in one clock for all nodes, the shared file
system's, and a file the follower writes there itself puts that clock into its own
(`FileClock`): so starts and exits are timed by when their files were written.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.agent.protocol import Frame
from orchestrator.agent.ranks import RankFile
from orchestrator.backends.sessions import Event
from orchestrator.console.sink import LogSink
from orchestrator.record.states import NodePhase
from orchestrator.supervise import NodeState, Supervisor
from orchestrator.supervise.clocks import NodeClock
from orchestrator.supervise.frame_handlers import handle as handle_event

READ_BYTES = 1 << 20  # per file and pump


class AttemptFiles:
    """The files of one attempt's nodes, each `nproc` ranks, tailed from where they were."""

    def __init__(self, attempt_dir: Path, nnodes: int, nproc: int) -> None:
        self.attempt_dir = attempt_dir
        self.rank_files: dict[int, RankFile] = {}
        self.metrics_files: dict[int, RankFile] = {}
        self.node_files: dict[int, RankFile] = {}
        for k in range(nnodes):
            for rank in range(k * nproc, (k + 1) * nproc):
                self.rank_files[rank] = RankFile(rank, str(self.node_dir(k) / f"rank-{rank}.out"))
                path = self.node_dir(k) / f"metrics-{rank}.jsonl"
                self.metrics_files[rank] = RankFile(rank, str(path))
            self.node_files[k] = RankFile(k, str(self.node_dir(k) / "node.out"))
        self.reported: dict[int, list[str]] = {}  # rank -> its rank-R.exit last passed on
        # The job directory, where a launch keeps the nodes' files (never a relative path).
        job_dir = attempt_dir.parent if attempt_dir.is_absolute() else None
        self.clock = FileClock(job_dir / ".orchestrator-clock" if job_dir else None)

    def node_dir(self, k: int) -> Path:
        return self.attempt_dir / f"node{k}"

    def tails(self) -> dict[str, RankFile]:
        """Every file tailed, by its path under the attempt's folder."""
        files = [*self.rank_files.values(), *self.metrics_files.values()]
        return {
            os.path.relpath(tail.path, self.attempt_dir): tail
            for tail in [*files, *self.node_files.values()]
        }

    def positions(self) -> dict[str, int]:
        """How far each file has been passed on (orchestrator.slurm.following.handover)."""
        return {name: tail.position() for name, tail in self.tails().items() if tail.fd is not None}

    def resume(self, positions: dict[str, int]) -> None:
        """Pass the files on from `positions` (a follower's before this one)."""
        for name, tail in self.tails().items():
            if positions.get(name):
                tail.seek(positions[name])

    def close(self) -> None:
        for tail in self.tails().values():
            tail.close()

    def pump(
        self,
        sink: LogSink,
        sup: Supervisor,
        rank_exited: Callable[[int, int, float], None],
        node_exited: Callable[[NodeState, int, float], None],
        only: set[int] | None = None,
    ) -> bool:
        """Pass on new output; record node starts, then rank exits (in the order they
        happened, through `rank_exited(rank, code, when)`), then node exits (through
        `node_exited(node, code, when)`); of the nodes `only` (None: all). Whether anything
        came: the follower reads again soon after something did, and less often while the
        files rest."""
        now, came = time.time(), False
        nodes = [node for node in sup.nodes if only is None or node.index in only]
        ranks = {rank for node in nodes for rank in node.ranks}
        # Lines and metrics as an agent's frames would bring them (frame_handlers.py): the
        # same console, hang clock and restarts whichever way they came.
        for kind, files in (
            (Frame.RANK_OUTPUT, self.rank_files),
            (Frame.METRICS, self.metrics_files),
        ):
            for rank, tail in files.items():
                if rank in ranks and (data := tail.read_lines(READ_BYTES)):
                    event = Event(sup.ranks[rank].node, kind, (str(rank),), data, now)
                    handle_event(sup, event)
                    came = True
        self.clock.measure()
        for node in nodes:
            start_file = self.node_dir(node.index) / "node.start"
            if node.state == NodePhase.STARTING and read_fields(start_file):
                sup.node_started(node, self.clock.written(start_file))
                came = True
            if data := self.node_files[node.index].read_lines(READ_BYTES):
                sink.node_output(node.index, data)
                came = True
        ended = []
        for rank, rank_file in self.rank_files.items():
            if rank not in ranks:
                continue
            fields = read_fields(self.node_dir(sup.ranks[rank].node) / f"rank-{rank}.exit")
            # Not there yet, or passed on already: a new line is the rank's next run ending.
            if not fields or self.reported.get(rank) == fields or not rank_file.at_end():
                continue
            self.reported[rank] = fields
            sink.rank_output(rank, rank_file.rest())
            when = self.clock.written(self.node_dir(sup.ranks[rank].node) / f"rank-{rank}.exit")
            ended.append((when, rank, int(fields[0]), fields[2:]))
        for when, rank, code, error_file in sorted(ended):
            if error_file and os.path.isfile(error_file[0]):
                sup.rank_error_file(rank, Path(error_file[0]).read_text(errors="replace"))
            rank_exited(rank, code, when)
        for node in nodes:
            exit_file = self.node_dir(node.index) / "node.exit"
            if not node.done and (fields := read_fields(exit_file)):
                sink.node_output(node.index, self.node_files[node.index].rest())
                node_exited(node, int(fields[0]), self.clock.written(exit_file))
                came = True
        return came or bool(ended)

    def settle(
        self,
        sup: Supervisor,
        rank_exited: Callable[[int, int, float], None],
        node_exited: Callable[[NodeState, int, float], None],
    ) -> None:
        """After the job completed: the exits its files hold of ranks and nodes that were
        not heard to end. A node agent's last frames can be lost when SLURM ends the job
        and cancels the launcher's dial steps before they passed them on; the exit files,
        written before the node's part ended, are complete by then (their output lines
        came, if at all, through the agent, and are not read again)."""
        ended = []
        for rank, state in sup.ranks.items():
            path = self.node_dir(state.node) / f"rank-{rank}.exit"
            if state.exit_code is None and (fields := read_fields(path)):
                ended.append((self.clock.written(path), rank, int(fields[0])))
        for when, rank, code in sorted(ended):
            rank_exited(rank, code, when)
        for node in sup.nodes:
            path = self.node_dir(node.index) / "node.exit"
            if not node.done and (fields := read_fields(path)):
                node_exited(node, int(fields[0]), self.clock.written(path))


def read_fields(path: Path) -> list[str] | None:
    """The fields of a one-line file the script writes (None until it is complete)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    return text.split() if text.endswith("\n") and text.strip() else None


class FileClock:
    """The shared file system's clock (its files' modification times) in the follower's.

    Writing a file between two readings of the follower's clock brackets its modification
    time: the offset is known to within half that interval (see supervise.clocks).
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.clock = NodeClock()
        self.measured = 0.0

    def measure(self, every: float = 5.0) -> None:
        now = time.monotonic()
        if self.path is None or now - self.measured < every:
            return
        self.measured = now
        try:
            sent = time.time()
            self.path.write_bytes(b"")
            os.utime(self.path)  # an empty write may leave the time as it was
            stamped = self.path.stat().st_mtime
            self.clock.bracket(sent, stamped, time.time())
        except OSError:  # not writable here: the times stay the file system's
            pass

    def written(self, path: Path) -> float:
        """When `path` was last written, in the follower's clock (now, if it is gone)."""
        try:
            return self.clock.to_controller(path.stat().st_mtime)
        except OSError:
            return time.time()
