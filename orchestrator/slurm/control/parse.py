"""What SLURM prints, read: sbatch's job id, squeue / scontrol / sacct job records, exit codes.

Pure functions on captured text (tests/unit/slurm/test_slurm_parse.py feeds them SLURM's real
outputs); orchestrator.slurm.control.client runs the commands and hands their output here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.backends.scheduler_states import SchedulerState
from orchestrator.errors import OrchestratorError
from orchestrator.numerals import NumberError, shown, whole_number

# Pending reasons that no amount of waiting resolves: the request does not fit the
# partition, account or QOS (sbatch accepts such jobs unless EnforcePartLimits is set).
UNRUNNABLE = {
    "PartitionNodeLimit": "asks for more nodes than the partition has or allows",
    "PartitionTimeLimit": "asks for more time than the partition allows",
    "PartitionConfig": "does not fit the partition's configuration (nodes, CPUs, GPUs...)",
    "BadConstraints": "its constraints cannot be met",
    "InvalidAccount": "the account is not valid",
    "InvalidQOS": "the QOS is not valid",
    "AccountNotAllowed": "the account may not use the partition",
    "QOSNotAllowed": "the QOS may not use the partition",
}
# SLURM's job states in our words: the one table (squeue's %T, scontrol's JobState, sacct's
# State). A word not here (a newer SLURM's) is OTHER: not ended, and no decision turns on it.
SLURM_STATES = {
    "PENDING": SchedulerState.QUEUED,
    "REQUEUED": SchedulerState.REQUEUED,
    "REQUEUE_HOLD": SchedulerState.REQUEUED,
    "REQUEUE_FED": SchedulerState.REQUEUED,
    "CONFIGURING": SchedulerState.STARTING,
    "RUNNING": SchedulerState.RUNNING,
    "COMPLETING": SchedulerState.ENDING,
    "SUSPENDED": SchedulerState.SUSPENDED,
    "STOPPED": SchedulerState.SUSPENDED,
    "COMPLETED": SchedulerState.SUCCEEDED,
    "FAILED": SchedulerState.FAILED,
    "SPECIAL_EXIT": SchedulerState.FAILED,
    "REVOKED": SchedulerState.FAILED,
    "CANCELLED": SchedulerState.CANCELLED,
    "TIMEOUT": SchedulerState.TIME_LIMIT,
    "DEADLINE": SchedulerState.DEADLINE,
    "NODE_FAIL": SchedulerState.NODE_FAILED,
    "BOOT_FAIL": SchedulerState.BOOT_FAILED,
    "PREEMPTED": SchedulerState.PREEMPTED,
    "OUT_OF_MEMORY": SchedulerState.OUT_OF_MEMORY,
    "UNKNOWN": SchedulerState.UNKNOWN,  # ours: squeue, scontrol and sacct no longer know the job
}
IDLE = "idle"  # sinfo's %T for a node that could take a job now


def slurm_state(word: str) -> SchedulerState:
    """SLURM's word for a job's state, in ours."""
    return SLURM_STATES.get(word, SchedulerState.OTHER)


@dataclass(frozen=True)
class JobInfo:
    """What SLURM says about a job right now."""

    state: str  # SLURM's own word, as shown: PENDING, RUNNING, COMPLETING, ... or UNKNOWN
    reason: str = ""
    nodelist: str = ""
    exit_code: int | None = None  # the batch script's, 128+N for signal N
    restarts: int = 0
    source: str = "squeue"
    preempted: bool = False  # scontrol's PreemptTime: a higher-priority job takes the nodes

    @property
    def scheduler_state(self) -> SchedulerState:
        """The state in our words, which every decision on the job reads."""
        return slurm_state(self.state)

    @property
    def ended(self) -> bool:
        return self.scheduler_state.ended


def parse_job_id(stdout: str) -> int:
    """`sbatch --parsable` prints `ID` or `ID;CLUSTER`; plain sbatch `Submitted batch job ID`."""
    text = stdout.strip()
    match = re.search(r"^(\d+)(?:;\S+)?$", text, re.MULTILINE) or re.search(
        r"Submitted batch job (\d+)", text
    )
    try:
        return whole_number(match.group(1) if match else "", "a job id", 1)
    except NumberError:
        raise OrchestratorError(f"sbatch printed no job id: {shown(text)}") from None


def parse_exit_code(text: str) -> int | None:
    """SLURM's `EXIT:SIGNAL` (`3:0`, `0:15`) -> a shell-style code (3, 143)."""
    code, _, signum = text.strip().partition(":")
    try:  # SLURM's codes are bytes; 255 bounds both, and anything else is not one
        code, signum = (whole_number(n, "an exit code", 0, 255) for n in (code, signum))
    except NumberError:
        return None
    return code if code or not signum else 128 + signum


def parse_squeue(stdout: str) -> JobInfo | None:
    """`squeue -h -j ID -o %T|%r|%N` -> JobInfo; None when the job is no longer listed."""
    for line in stdout.splitlines():
        if line.strip():
            state, _, rest = line.strip().partition("|")
            reason, _, nodelist = rest.partition("|")
            return JobInfo(state=state.split()[0], reason=reason.strip(), nodelist=nodelist.strip())
    return None


def parse_pairs(text: str) -> dict[str, str]:
    """`scontrol -o show job` (Key=value, values may hold spaces) -> dict."""
    pairs: dict[str, str] = {}
    key = None
    for token in text.split():
        name, sep, value = token.partition("=")
        if sep and re.match(r"^[A-Za-z][A-Za-z0-9_/:]*$", name):
            key = name
            pairs[key] = value
        elif key is not None:
            pairs[key] += " " + token
    return pairs


def parse_scontrol_job(stdout: str) -> JobInfo | None:
    pairs = parse_pairs(stdout)
    if "JobState" not in pairs:
        return None
    return JobInfo(
        state=pairs["JobState"],
        reason=pairs.get("Reason", ""),
        nodelist=pairs.get("NodeList", "") if pairs.get("NodeList") != "(null)" else "",
        exit_code=parse_exit_code(pairs.get("ExitCode", "")),
        restarts=_count(pairs.get("Restarts")),
        source="scontrol",
        preempted=pairs.get("PreemptTime", "None") not in ("None", "", "Unknown"),
    )


def _count(text: str | None) -> int:
    """A count SLURM printed (Restarts=); 0 when absent or not a number."""
    try:
        return whole_number(text or "0", "a count")
    except NumberError:
        return 0


def parse_sacct(stdout: str) -> JobInfo | None:
    """`sacct -n -P -X -j ID -o State,ExitCode,NodeList` -> JobInfo (the last line wins)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    state, exit_code, nodelist = (lines[-1].split("|") + ["", "", ""])[:3]
    # "CANCELLED by 0" -> CANCELLED
    return JobInfo(
        state=state.split()[0] if state.strip() else "UNKNOWN",
        exit_code=parse_exit_code(exit_code),
        nodelist=nodelist.strip(),
        restarts=len(lines) - 1,
        source="sacct",
    )


def parse_sinfo_idle(stdout: str) -> set[str]:
    """`sinfo -h -N -n NAMES -o %N|%T` -> the nodes SLURM holds idle."""
    idle = set()
    for line in stdout.splitlines():
        name, _, state = line.strip().partition("|")
        if state == IDLE:
            idle.add(name)
    return idle


def parse_sinfo_down(stdout: str) -> dict[str, str]:
    """`sinfo -h -N -n NAMES -o %N|%T|%E` -> the nodes SLURM holds down, failed or not
    responding (`idle*`), each with its state and why (`down*: Not responding`)."""
    found = {}
    for line in stdout.splitlines():
        name, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        if state.endswith("*") or "down" in state or "fail" in state:
            found[name] = f"{state}" + (f": {reason}" if reason and reason != "none" else "")
    return found
