"""What an older orchestrator wrote in a run record under another name, read back under
today's: a SLURM run's jobs were its `segments` (each numbered `segment`) in status.json
and follower.json before they were its `attempts` (each numbered `attempt`), the word SSH
runs use. The one place that knows the old names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

OLDER_NAMES = {"attempts": "segments", "attempt": "segment"}  # today's: what it was


def saved(data: Mapping[str, Any], name: str) -> Any:
    """data[name], or what an older orchestrator wrote under name's older name; KeyError
    (naming today's) where neither is there."""
    if name in data:
        return data[name]
    older = OLDER_NAMES.get(name)
    if older is not None and older in data:
        return data[older]
    raise KeyError(name)


def job_attempts(status: Mapping[str, Any]) -> list:
    """status.json's `attempts` (a SLURM run's jobs, one entry each, numbered `attempt`),
    from a record an older orchestrator wrote as well; [] where there are none."""
    try:
        entries = saved(status, "attempts") or []
    except KeyError:
        return []
    return [_numbered(entry) for entry in entries]


def _numbered(entry: Any) -> Any:
    """An entry of `attempts` with its number under today's name."""
    if not isinstance(entry, dict) or "attempt" in entry or "segment" not in entry:
        return entry
    return {"attempt": entry["segment"], **{k: v for k, v in entry.items() if k != "segment"}}
