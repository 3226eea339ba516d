"""A run's state, and the one rule for the state a reader of its record sees.

status.json keeps the state as a plain string (`RunState`'s values), written by the run's
controller. Whoever reads it later sees that state, unless the run has not ended and the
controller that keeps the record is gone: an SSH or local run is then `lost` (its nodes
stop by themselves once they lose contact with it), while a SLURM job goes on without it,
so SLURM's word on the job decides (slurm/control/client.py's `refresh_status` records its end).
`observed_state` is that rule, for the command line and the Python API alike.

A node's and a rank's state (`NodePhase`, `RankPhase`) are words of status.json's `nodes`
and `ranks` too, kept by supervision (orchestrator.supervise.state) and read back by the
console, the command line and the API.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from orchestrator.options.backend_facts import facts_of


class RunState(str, Enum):
    """What a run is doing, or how it ended; the value is the word status.json keeps."""

    STARTING = "starting"
    QUEUED = "queued"  # SLURM: submitted, not yet running
    RUNNING = "running"
    STOPPING = "stopping"
    RECOVERING = "recovering"  # --spares: a node fault ended an attempt; a spare replaces it
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"
    HUNG = "hung"
    UNREACHABLE = "unreachable"  # the job's rendezvous or mesh could not form: a path drops

    @property
    def is_final(self) -> bool:
        """The run has ended; it never leaves this state."""
        return self in _FINAL

    @classmethod
    def parse(cls, word: object) -> RunState | None:
        """The state a record names, or None where it names none we know."""
        try:
            return cls(word)
        except ValueError:
            return None

    def __str__(self) -> str:  # the word itself in messages, on every Python version
        return self.value


_FINAL = frozenset(
    {
        RunState.SUCCEEDED,
        RunState.FAILED,
        RunState.STOPPED,
        RunState.LOST,
        RunState.HUNG,
        RunState.UNREACHABLE,
    }
)


class NodePhase(str, Enum):
    """Where one node of a run is: its script starting or running, or how it ended; the
    value is the word status.json keeps (also a node's result of one command, nodes/execute)."""

    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # ended by a stop (the run's, or the time limit's warning)
    LOST = "lost"  # its agent went silent or ended without reporting

    def __str__(self) -> str:
        return self.value


class RankPhase(str, Enum):
    """Where one rank of a run is, or how it ended; the value is the word status.json keeps."""

    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"  # failed, and torchrun starts the workers again (--max-restarts)
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    KILLED = "killed"  # its node ended during a stop before the rank's exit was heard
    UNKNOWN = "unknown"  # its node ended (or was lost) before the rank's exit was heard

    def __str__(self) -> str:
        return self.value


def observed_state(
    recorded: RunState | None, backend: str | None, controller_alive: bool
) -> RunState | None:
    """The state a reader sees: the recorded one, or `lost` where an SSH or local run has
    not ended and its controller is gone. A SLURM run keeps its recorded state: its job
    does not depend on the controller."""
    if recorded is None or recorded.is_final or controller_alive or facts_of(backend).scheduled:
        return recorded
    return RunState.LOST


@dataclass(frozen=True)
class RunStatus:
    """A run's status.json as read now: the state a reader sees (`observed_state`) and the
    fields the command line and the API use; `document` is the whole of it, as written."""

    run_id: str
    state: RunState | None  # None: the record names no state we know (`document` has it)
    recorded_state: RunState | None  # as status.json says, before the rule above
    backend: str | None
    controller_alive: bool
    exit_code: int | None
    summary: str
    started_at: str | None
    ended_at: str | None
    document: Mapping = field(repr=False, compare=False)

    @classmethod
    def of(cls, document: Mapping, controller_alive: bool) -> RunStatus:
        """The status of a status.json document, its controller alive or not."""
        recorded = RunState.parse(document.get("state"))
        backend = document.get("backend")
        code = document.get("exit_code")
        return cls(
            run_id=str(document.get("run_id")),
            state=observed_state(recorded, backend, controller_alive),
            recorded_state=recorded,
            backend=backend,
            controller_alive=controller_alive,
            exit_code=None if code is None else int(code),
            summary=str(document.get("summary") or ""),
            started_at=document.get("started_at"),
            ended_at=document.get("ended_at"),
            document=document,
        )

    @property
    def ended(self) -> bool:
        """Its state is final: recorded so, or lost."""
        return self.state is not None and self.state.is_final

    @property
    def ended_in_record(self) -> bool:
        """The controller recorded the run's end."""
        return self.recorded_state is not None and self.recorded_state.is_final

    @property
    def being_written(self) -> bool:
        """Its controller still writes the record (and the logs): not ended, and alive."""
        return self.controller_alive and not self.ended

    @property
    def asks_slurm(self) -> bool:
        """A SLURM run not ended and followed by no controller: only SLURM knows its end."""
        scheduled = facts_of(self.backend).scheduled
        return scheduled and not self.controller_alive and not self.ended
