"""The metrics channel on the controller: runs/<id>/metrics.jsonl, and stragglers named.

Every rank may write JSON objects, one per line, to the file its ORCHESTRATOR_METRICS_FILE
names (the bundled trainer does); the node's agent ships them with a sample of the node
every few seconds (orchestrator.agent.sampling). Here each becomes one line of
metrics.jsonl, stamped with the controller's clock (`time`) and where it came from, in the
order it arrived:

    {"time": ..., "host": "ceon3", "node_rank": 3, "rank": 12, "metrics": {...as written}}
    {"time": ..., "host": "ceon3", "node_rank": 3, "sample": {"cpu_percent": ..., ...}}
    {"time": ..., "host": "ceon3", "node_rank": 3, "event": "start", "detail": ""}

Events mark a node's timeline (probe, stamped when its preflight probe began; start, end,
failed, lost, restart, straggler; the last three also name the `rank`) and the run's (`stop`,
with host and node_rank null). `orchestrator top` and `orchestrator plot` read this file;
status.json lists the stragglers. A record whose `step` differs from the last its rank
reported is progress, which the hang check reads (supervise/hangs.py); one that repeats the
step is not.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from orchestrator.record.goodput.phases import is_mark
from orchestrator.record.logfile import LogFile, open_append
from orchestrator.supervise.state import NodeState
from orchestrator.supervise.stragglers import Straggler, Stragglers

CHECK_S = 1.0  # how often stragglers are looked for


class RunMetrics:
    """metrics.jsonl of one run, and the stragglers its records show."""

    def __init__(
        self,
        path: Path | None,
        hosts: dict[int, str],
        note: Callable[[str], None],
        stragglers: Stragglers | None = None,
    ) -> None:
        self.file = LogFile(path, False, open_append) if path is not None else None
        self.note = note
        self.stragglers = stragglers or Stragglers(hosts)
        self.latest: dict[int, tuple[float, dict]] = {}  # rank -> (when, its last record)
        self.steps: dict[int, int] = {}  # rank -> the last step it reported
        self.not_json: set[int] = set()  # ranks told about a line that is not a JSON object
        self.checked = 0.0

    def _append(self, record: dict) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record, separators=(",", ":")).encode() + b"\n")

    def rank_lines(self, node: NodeState, rank: int, data: bytes, now: float) -> bool:
        """Whole lines from `rank`'s metrics channel; whether one reported a new step (an
        integer `step` other than the rank's last: a rank restarted from a checkpoint may
        go back)."""
        stepped = False
        for line in data.splitlines():
            if not line.strip():
                continue
            try:
                metrics = json.loads(line)
            except ValueError:
                metrics = None
            if not isinstance(metrics, dict):
                if rank not in self.not_json:
                    self.not_json.add(rank)
                    self.note(
                        f"{node.host}: rank {rank} wrote a line that is not a JSON object to "
                        "its ORCHESTRATOR_METRICS_FILE; such lines are skipped"
                    )
                continue
            self._append(
                {
                    "time": round(now, 3),
                    "host": node.host,
                    "node_rank": node.index,
                    "rank": rank,
                    "metrics": metrics,
                }
            )
            if not is_mark(metrics):  # a start's or a checkpoint's mark: not its figures
                self.latest[rank] = (now, metrics)
            self.stragglers.observe(rank, metrics, now)
            step = metrics.get("step")
            if type(step) is int and step != self.steps.get(rank):  # not a bool, a float
                self.steps[rank], stepped = step, True
        return stepped

    def node_sample(self, node: NodeState, data: bytes, now: float) -> None:
        try:
            sample = json.loads(data)
        except ValueError:
            return
        self._append(
            {"time": round(now, 3), "host": node.host, "node_rank": node.index, "sample": sample}
        )

    def probes(self, nodes: Sequence[NodeState], probes: dict[int, tuple[float, float]]) -> None:
        """The preflight probe of each node (by index): (began, ended), as `probe` events."""
        by_index = {node.index: node for node in nodes}
        for index, (began, ended) in sorted(probes.items()):
            if index in by_index:
                self.event("probe", by_index[index], f"{ended - began:.1f} s", when=began)

    def event(
        self,
        kind: str,
        node: NodeState | None = None,
        detail: str = "",
        rank: int | None = None,
        when: float | None = None,
    ) -> None:
        record = {
            "time": round(time.time() if when is None else when, 3),
            "host": node.host if node is not None else None,
            "node_rank": node.index if node is not None else None,
            "event": kind,
            "detail": detail,
        }
        if rank is not None:
            record["rank"] = rank
        self._append(record)

    def heard_from(self, rank: int, now: float) -> None:
        self.stragglers.heard_from(rank, now)

    def check(
        self, now: float, running: Callable[[], set[int]], nodes: list[NodeState]
    ) -> list[Straggler]:
        """Stragglers named now (looked for at most once a CHECK_S) among the `running`
        ranks: each on the console and in the file."""
        if now - self.checked < CHECK_S:
            return []
        self.checked = now
        found = self.stragglers.check(now, running())
        for straggler in found:
            self.note(straggler.line())
            node = next((n for n in nodes if straggler.rank in n.ranks), None)
            self.event("straggler", node, straggler.line(), rank=straggler.rank)
        return found

    def status(self) -> dict:
        return {"stragglers": self.stragglers.status()}

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
