"""Streaming one attempt of a SLURM job: the files its nodes write, into the LogSink.

The sbatch script writes, under `<job dir>/attempt<restart>/node<K>/` on the shared file
system, each rank's output and exit (rank-R.out, rank-R.exit) and the node's own output,
start and exit (node.out, node.start, node.exit). `AttemptFiles.pump` tails the output as
whole lines into the sink and passes starts and exits on to the `Supervisor`, a rank's exit
only once all its output is on the way (as the agent does on SSH nodes). Under torchrun's
--max-restarts a rank runs again within the same attempt: its rank-R.out grows on and its
rank-R.exit is rewritten when it ends again, which is passed on as its next exit.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from orchestrator.agent.ranks import RankFile
from orchestrator.logs import LogSink
from orchestrator.supervise import NodeState, Supervisor

READ_BYTES = 1 << 20  # per file and pump


class AttemptFiles:
    """The files of one attempt's nodes, each `nproc` ranks, tailed from where they were."""

    def __init__(self, attempt_dir: Path, nnodes: int, nproc: int) -> None:
        self.attempt_dir = attempt_dir
        self.rank_files: dict[int, RankFile] = {}
        self.node_files: dict[int, RankFile] = {}
        for k in range(nnodes):
            for rank in range(k * nproc, (k + 1) * nproc):
                self.rank_files[rank] = RankFile(rank, str(self.node_dir(k) / f"rank-{rank}.out"))
            self.node_files[k] = RankFile(k, str(self.node_dir(k) / "node.out"))
        self.reported: dict[int, list[str]] = {}  # rank -> its rank-R.exit last passed on

    def node_dir(self, k: int) -> Path:
        return self.attempt_dir / f"node{k}"

    def close(self) -> None:
        for tail in [*self.rank_files.values(), *self.node_files.values()]:
            if tail.fd is not None:
                os.close(tail.fd)
                tail.fd = None

    def pump(
        self,
        sink: LogSink,
        sup: Supervisor,
        rank_exited: Callable[[int, int, float], None],
        node_exited: Callable[[NodeState, int, float], None],
    ) -> None:
        """Pass on new output; record node starts, then rank exits (in the order they
        happened, through `rank_exited(rank, code, when)`), then node exits (through
        `node_exited(node, code, when)`)."""
        for rank, rank_file in self.rank_files.items():
            if data := rank_file.read_lines(READ_BYTES):
                sink.rank_output(rank, data)
                if sup.ranks[rank].state == "restarting":  # output again: torchrun restarted it
                    sup.rank_restarted(sup.ranks[rank])
        for node in sup.nodes:
            if node.state == "starting" and (
                start := read_fields(self.node_dir(node.index) / "node.start")
            ):
                node.state, node.started_at = "running", float(start[1])
                for rank in node.ranks:
                    sup.ranks[rank].state = "running"
                sup.on_change(sup)
            if data := self.node_files[node.index].read_lines(READ_BYTES):
                sink.node_output(node.index, data)
        ended = []
        for rank, rank_file in self.rank_files.items():
            fields = read_fields(self.node_dir(sup.ranks[rank].node) / f"rank-{rank}.exit")
            # Not there yet, or passed on already: a new line is the rank's next run ending.
            if not fields or self.reported.get(rank) == fields or not rank_file.at_end():
                continue
            self.reported[rank] = fields
            sink.rank_output(rank, rank_file.rest())
            ended.append((float(fields[1]), rank, int(fields[0]), fields[2:]))
        for when, rank, code, error_file in sorted(ended):
            if error_file and os.path.isfile(error_file[0]):
                sup.ranks[rank].error_file = Path(error_file[0]).read_text(errors="replace")
            rank_exited(rank, code, when)
        for node in sup.nodes:
            if not node.done and (fields := read_fields(self.node_dir(node.index) / "node.exit")):
                sink.node_output(node.index, self.node_files[node.index].rest())
                node_exited(node, int(fields[0]), float(fields[1]))


def read_fields(path: Path) -> list[str] | None:
    """The fields of a one-line file the script writes (None until it is complete)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    return text.split() if text.endswith("\n") and text.strip() else None
