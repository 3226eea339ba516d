"""This node's ranks: which process each one is, and each one's output file tailed as whole
lines, then its exit.

The script's run_rank writes rank-N.out as the rank runs and rank-N.exit (`rc time
[error_file]` and a newline) when it ends, anew each time torchrun restarts it; the rank
itself may write its metrics channel, metrics-N.jsonl (ORCHESTRATOR_METRICS_FILE). A rank's
exit is shipped only once all its output and metrics are on the way, so the controller never
sees a rank end before its last line.

Standard library only: this module runs on the nodes too (see orchestrator.agent.bootstrap).
"""

from __future__ import annotations

import contextlib
import os

from orchestrator.agent.disk import DiskWatch, is_fault
from orchestrator.agent.processes import children_of
from orchestrator.agent.protocol import Frame, frame
from orchestrator.agent.sampling import rank_in_environ
from orchestrator.agent.shipping import MAX_PENDING_OUT, READ_CHUNK, Outbox, mask

MAX_LINE = 1 << 20  # a longer line without newline is passed on in pieces of this size


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

    def position(self) -> int:
        """The offset of the first byte not yet passed on as a whole line."""
        if self.fd is None:
            return 0
        return os.lseek(self.fd, 0, os.SEEK_CUR) - len(self.partial)

    def seek(self, offset: int) -> None:
        """Read on from `offset` (a `position` of before); a file not there yet is read
        from its start once it is."""
        self.partial = b""
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return
        os.lseek(self.fd, offset, os.SEEK_SET)

    def at_end(self) -> bool:
        """Everything written so far has been read (or the file was never created)."""
        if self.fd is None:
            try:
                self.fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return True
        return os.lseek(self.fd, 0, os.SEEK_CUR) >= os.fstat(self.fd).st_size

    def close(self) -> None:
        """Let the file go (read again from its start if read again)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def rest(self) -> bytes:
        """The last line when the rank ended without a newline."""
        data, self.partial = self.partial, b""
        return data + b"\n" if data else b""


class NodeRanks:
    """The ranks of this node, shipped through `outbox`: their lines, then their exits."""

    def __init__(
        self, node_dir: str | None, ranks: list[int], outbox: Outbox, disk: DiskWatch
    ) -> None:
        self.node_dir = node_dir
        self.files = (
            [RankFile(r, os.path.join(node_dir, f"rank-{r}.out")) for r in ranks]
            if node_dir
            else []
        )
        self.metrics = (
            [RankFile(r, os.path.join(node_dir, f"metrics-{r}.jsonl")) for r in ranks]
            if node_dir
            else []
        )
        self.outbox = outbox
        self.disk = disk
        self.exited: set[int] = set()
        self.reported: dict[int, str] = {}  # rank -> its rank-N.exit line last shipped
        self.stopped_at: float | None = None  # when the step began stopping (node clock)

    def all_exited(self) -> bool:
        return bool(self.files) and len(self.exited) == len(self.files)

    def all_succeeded(self) -> bool:
        """Every rank of the node ended with exit 0 (and its output is shipped)."""
        return self.all_exited() and all(
            line.split(" ", 1)[0] == "0" for line in self.reported.values()
        )

    def ship_output(self) -> None:
        """New whole lines of every rank, a fair share each of the room left in the outbox."""
        room = MAX_PENDING_OUT - len(self.outbox.data)
        if room <= 0:
            return
        share = room // max(1, 2 * len(self.files))
        for rank, metrics in zip(self.files, self.metrics, strict=True):
            self.outbox.output(rank.rank, rank.read_lines(share))
            self.outbox.metrics(metrics.rank, metrics.read_lines(share))

    def ship_exits(self) -> None:
        """E (and F, torch's error file) for each rank that ended and whose output is sent."""
        if not self.node_dir:
            return
        for rank, metrics in zip(self.files, self.metrics, strict=True):
            line = read_exit(os.path.join(self.node_dir, f"rank-{rank.rank}.exit"))
            # Not there yet, or shipped already: a new line is the rank's next attempt
            # (torchrun --max-restarts restarted it) ending.
            if line is None or self.reported.get(rank.rank) == line:
                continue
            rc, when, *error_file = line.strip().split(" ", 2)
            # The rank has ended; report it once all its output is on the way.
            if not rank.at_end():
                continue
            self.outbox.metrics(metrics.rank, metrics.read_lines(MAX_PENDING_OUT))
            self.outbox.output(rank.rank, rank.rest())
            self.exited.add(rank.rank)
            self.reported[rank.rank] = line
            if error_file and os.path.isfile(error_file[0]):
                with open(error_file[0], "rb") as handle:
                    self.outbox.send_masked(
                        Frame.ERROR_FILE, rank.rank, payload=handle.read(1 << 16)
                    )
            stopped = self.stopped_at is not None and float(when) >= self.stopped_at
            if rc != "0" and not stopped:
                self.disk.probe()  # a W before the E it may explain
            self.outbox.send(frame(Frame.RANK_EXITED, rank.rank, rc, when, int(stopped)))

    def drain(self, flush_timeout: float) -> None:
        """Send what the ranks wrote last, in bounded pieces, then any unfinished line."""
        for rank, metrics in zip(self.files, self.metrics, strict=True):
            while data := rank.read_lines(MAX_PENDING_OUT):
                self.outbox.output(rank.rank, data)
                self.outbox.flush(flush_timeout)
            self.outbox.output(rank.rank, rank.rest())
            while data := metrics.read_lines(MAX_PENDING_OUT):
                self.outbox.metrics(metrics.rank, data)
                self.outbox.flush(flush_timeout)

    def mask_files(self) -> None:
        """The ranks' raw output stays on the node: never with a secret in clear."""
        if not self.outbox.secrets:
            return
        for rank in self.files:
            masked = rank.path + ".masking"
            try:
                with open(rank.path, "rb") as raw, open(masked, "wb") as out:
                    for line in raw:
                        out.write(mask(line, self.outbox.secrets))
                os.replace(masked, rank.path)
            except FileNotFoundError:  # a rank that never started
                pass
            except OSError as exc:  # the raw file stays; the masked copy could not be made
                if is_fault(exc):
                    self.disk.report(exc)
                with contextlib.suppress(OSError):
                    os.remove(masked)


def read_exit(path: str) -> str | None:
    """A rank's exit file, `rc time [error_file]` and a newline; None until it is whole."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    return text if text.endswith("\n") else None  # else still being written


def rank_pids(root_pid: int) -> dict[int, int]:
    """rank -> the pid of that rank's process, among the descendants of `root_pid`.

    A rank's process is the topmost Python process whose environment holds RANK, searched
    breadth first: under ours that is torchrun's worker (agent -> bash node script ->
    torchrun -> bash run_rank (RANK, not Python) -> python train.py), and not what the
    worker starts with the same RANK (DataLoader workers, compile workers), which sit below
    it. Where no Python process holds a RANK, the topmost process holding it counts, so the
    rank still gets a record (saying it is not Python).
    """
    found: dict[int, int] = {}
    other: dict[int, int] = {}
    level = [root_pid]
    while level:
        below: list[int] = []
        for pid in level:
            rank = rank_in_environ(pid)
            if rank is not None and rank not in found:
                if is_python(pid):
                    found[rank] = pid
                else:
                    other.setdefault(rank, pid)
            below.extend(children_of(pid))
        level = below
    return dict(sorted({**other, **found}.items()))


def is_python(pid: int) -> bool:
    """Whether the process runs a Python interpreter (python, python3, python3.11, ...)."""
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python")
    except OSError:
        return False
