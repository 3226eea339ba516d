"""Node samples for the metrics channel: what the run's processes use, every few seconds.

One every SAMPLE_S (5 s), shipped when it differs from the last one shipped (see
`differs`), and at least every QUIET_SAMPLE_S (30 s) while nothing changes.

A sample is one JSON object (the P frame's payload), from the agent's heartbeat-like
thread of its own:

    {"cpu_percent": 187.5, "rss_bytes": ..., "mem_total_bytes": ..., "mem_available_bytes": ...,
     "ranks": {"3": {"cpu_percent": 95.0, "rss_bytes": ..., "gpu": 0, "gpu_mem_bytes": ...}},
     "gpus": [{"index": 0, "util_percent": 97, "mem_used_bytes": ..., "mem_total_bytes": ...,
               "temp_c": 61}]}

CPU is over the time since the previous sample, 100 per busy core, for every process under
the agent (the node script, torchrun, the ranks and what they started); a process counts
for the rank whose RANK its environment holds. The processes are found by walking
/proc/PID/task/TID/children down from the agent (processes.tree_of), so a sample reads only
the run's own processes, not every process of the node.

GPUs: `nvidia-smi --query-gpu` and `--query-compute-apps`, where the node has nvidia-smi
(it comes with the NVIDIA driver). NVML through a Python binding would save starting a
process every few seconds, but the agent runs on whatever interpreter the node has, with
the standard library alone (orchestrator.agent.bootstrap); nvidia-smi is always there
where a GPU is, and its CSV is stable.

Standard library only: this module runs on the nodes too (see orchestrator.agent.bootstrap).
"""

from __future__ import annotations

import os
import subprocess
import time

from orchestrator.agent.processes import stat_fields, tree_of

SAMPLE_S = 5.0  # between samples
# A sample is shipped when it differs from the last one shipped (a CPU share or GPU use by
# CPU_STEP points or more, memory by MEM_SHARE of its value or more, a temperature by
# TEMP_STEP_C, a rank or GPU come or gone), else once every QUIET_SAMPLE_S: a busy node is
# seen every SAMPLE_S, an idle one costs the controller one sample in six.
QUIET_SAMPLE_S = 30.0
CPU_STEP = 5.0
MEM_SHARE = 0.05
TEMP_STEP_C = 3.0
GPU_TIMEOUT_S = 10.0  # for one nvidia-smi call
MIB = 1 << 20
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
GPU_QUERY = "index,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu"
APPS_QUERY = "pid,gpu_uuid,used_memory"


def cpu_and_rss(pid: int) -> tuple[int, int] | None:
    """(user + system CPU in clock ticks, resident bytes) of a process; None if gone."""
    fields = stat_fields(pid)
    if fields is None or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[11]) + int(fields[12]), int(fields[21]) * PAGE


def rank_in_environ(pid: int) -> int | None:
    """The RANK its environment holds (torchrun's workers and what they start)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            environ = handle.read()
    except OSError:
        return None
    for entry in environ.split(b"\0"):
        if entry.startswith(b"RANK="):
            value = entry[5:]
            return int(value) if value.isdigit() else None
    return None


def memory() -> dict[str, int]:
    """The node's total and available memory, from /proc/meminfo."""
    wanted = {b"MemTotal:": "mem_total_bytes", b"MemAvailable:": "mem_available_bytes"}
    found: dict[str, int] = {}
    try:
        with open("/proc/meminfo", "rb") as handle:
            for line in handle:
                words = line.split()
                if words and words[0] in wanted:
                    found[wanted[words[0]]] = int(words[1]) * 1024
    except OSError:
        pass
    return found


def parse_gpus(text: str) -> list[dict]:
    """`nvidia-smi --query-gpu=GPU_QUERY --format=csv,noheader,nounits` as GPU entries;
    a field nvidia-smi cannot read ("[N/A]") is left out."""
    gpus = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 6 or not cells[0].isdigit():
            continue
        gpu: dict = {"index": int(cells[0]), "uuid": cells[1]}
        for key, cell, scale in (
            ("util_percent", cells[2], 1),
            ("mem_used_bytes", cells[3], MIB),
            ("mem_total_bytes", cells[4], MIB),
            ("temp_c", cells[5], 1),
        ):
            try:
                gpu[key] = int(float(cell) * scale)
            except ValueError:
                continue
        gpus.append(gpu)
    return gpus


def parse_apps(text: str) -> dict[int, tuple[str, int]]:
    """`nvidia-smi --query-compute-apps=APPS_QUERY --format=csv,noheader,nounits`:
    pid -> (GPU uuid, bytes it holds there)."""
    apps = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 3 or not cells[0].isdigit():
            continue
        try:
            apps[int(cells[0])] = (cells[1], int(float(cells[2]) * MIB))
        except ValueError:
            continue
    return apps


def differs(before: dict | None, after: dict) -> bool:
    """Whether `after` says something `before` (the last sample shipped) does not."""
    if before is None or _moved(before, after):
        return True
    ranks_before, ranks_after = before.get("ranks") or {}, after.get("ranks") or {}
    gpus_before, gpus_after = before.get("gpus") or [], after.get("gpus") or []
    if set(ranks_before) != set(ranks_after) or len(gpus_before) != len(gpus_after):
        return True
    return any(_moved(ranks_before[r], ranks_after[r]) for r in ranks_after) or any(
        _moved(b, a) for b, a in zip(gpus_before, gpus_after, strict=True)
    )


def _moved(before: dict, after: dict) -> bool:
    """Whether a plain value of `after` differs from `before`'s by a step worth shipping
    (nested ones are the caller's)."""
    if set(before) != set(after):
        return True
    for key, value in after.items():
        old = before[key]
        if isinstance(value, (dict, list)) or value == old:
            continue
        if not _number(value) or not _number(old) or abs(value - old) >= _step(key, old):
            return True
    return False


def _step(key: str, old: float) -> float:
    if key.endswith("_percent"):
        return CPU_STEP
    if key.endswith("_c"):
        return TEMP_STEP_C
    if key.endswith("_bytes"):
        return MEM_SHARE * abs(old)
    return 0.0  # any change: an index, a GPU's number


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class Sampler:
    """Samples of the processes under `root` (the agent), each over the time since the last."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.ticks: dict[int, int] = {}  # pid -> its CPU ticks at the previous sample
        self.at: float | None = None
        self.rank_of: dict[int, int | None] = {}
        import shutil  # here, not at the top: a step without samples (`exec`) never needs it

        self.nvidia_smi = shutil.which("nvidia-smi")

    def sample(self) -> dict:
        gpus, apps = self.gpus()
        now = time.monotonic()
        elapsed = now - self.at if self.at is not None else None
        total = {"cpu_ticks": 0, "rss_bytes": 0}
        ranks: dict[int, dict] = {}
        ticks: dict[int, int] = {}
        for pid in tree_of(self.root):
            used = cpu_and_rss(pid)
            if used is None:
                continue
            ticks[pid], rss = used
            # A process not there last time started since: all its CPU is in this interval.
            spent = ticks[pid] - self.ticks.get(pid, 0)
            if self.rank_of.get(pid) is None:  # read again: a process may exec into a rank
                self.rank_of[pid] = rank_in_environ(pid)
            rank = self.rank_of[pid]
            for entry in (total, ranks.setdefault(rank, {}) if rank is not None else None):
                if entry is not None:
                    entry["cpu_ticks"] = entry.get("cpu_ticks", 0) + spent
                    entry["rss_bytes"] = entry.get("rss_bytes", 0) + rss
            if rank is not None and pid in apps:
                uuid, held = apps[pid]
                ranks[rank]["gpu"] = next((g["index"] for g in gpus if g.get("uuid") == uuid), None)
                ranks[rank]["gpu_mem_bytes"] = ranks[rank].get("gpu_mem_bytes", 0) + held
        self.rank_of = {pid: self.rank_of[pid] for pid in ticks}
        self.ticks, self.at = ticks, now
        for entry in (total, *ranks.values()):
            spent = entry.pop("cpu_ticks", 0)
            entry["cpu_percent"] = round(100.0 * spent / TICKS / elapsed, 1) if elapsed else None
        for gpu in gpus:
            gpu.pop("uuid", None)
        return {
            **total,
            **memory(),
            "ranks": {str(rank): entry for rank, entry in sorted(ranks.items())},
            "gpus": gpus,
        }

    def gpus(self) -> tuple[list[dict], dict[int, tuple[str, int]]]:
        if self.nvidia_smi is None:
            return [], {}
        gpus = parse_gpus(self.query(f"--query-gpu={GPU_QUERY}"))
        apps = parse_apps(self.query(f"--query-compute-apps={APPS_QUERY}")) if gpus else {}
        return gpus, apps

    def query(self, what: str) -> str:
        try:
            result = subprocess.run(
                [self.nvidia_smi, what, "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=GPU_TIMEOUT_S,
            )
        except (OSError, subprocess.SubprocessError):
            return ""
        return result.stdout if result.returncode == 0 else ""
