"""A run's goodput kept in its record: computed once, as the run ends (its last line says
it), from status.json and metrics.jsonl (record/goodput/phases.py), and written into status.json's
`goodput`; the run's last status write keeps it (record/runs.py, RunRecord.write_status)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from orchestrator.errors import ConfigError
from orchestrator.record.goodput.phases import Goodput, compute, inputs_of, seconds_of
from orchestrator.record.runs import RunRecord


def read_records(path: Path) -> list[dict]:
    """The JSON objects of metrics.jsonl (none where it is missing); other lines skipped."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    records = []
    for line in text.splitlines():
        if line.startswith('{"time":') and '"sample":{' in line[:120]:
            continue  # a node's sample: nothing the goodput reads, and most of a long file
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def goodput_of(record: RunRecord, end: float | None = None) -> Goodput | None:
    """The run's goodput up to `end` (default: the end its status.json's goodput names, else
    now); None without a readable status.json."""
    try:
        status = record.read_status()
    except ConfigError:
        return None
    if end is None:
        kept = status.get("goodput")
        end = seconds_of(kept.get("to")) if isinstance(kept, dict) else None
    inputs = inputs_of(status, read_records(record.metrics_path))
    if inputs is None:
        return None
    return compute(inputs, time.time() if end is None else end)


def close(record_path: Path, end: float | None = None) -> dict | None:
    """Compute the run's goodput as it ends now (or at `end`) and keep it in status.json;
    status.json's `goodput`, or None where the folder holds no run."""
    record = RunRecord(Path(record_path))
    if not record.status_path.is_file():
        return None
    found = goodput_of(record, time.time() if end is None else end)
    if found is None:
        return None
    goodput = found.to_dict()
    try:
        status = record.read_status()
    except ConfigError:  # gone since it was read: nothing to keep it in
        return goodput
    record.write_status({**status, "goodput": goodput})
    return goodput
