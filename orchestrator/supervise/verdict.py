"""How a run ended, as one table: from what was recorded to a state and an exit code.

The facts are few and plain: was the controller interrupted, could a node not reach the
store or a peer (its agent saw the connections go unanswered: agent/connects.py), did the
run hang (no rank moved for the hang timeout: supervise/hangs.py), did every rank end after
the time limit's warning signal and before the limit (supervise/time_limit.py), what kind
of fault came first (before any stop, in the controller's clock), did the time limit stop
the run, was any node lost, and did the whole world (every rank and every node script) end
with exit 0. The first row that matches decides; a run is `succeeded` only by the last row,
so a killed, unknown or never-started rank, or a node once lost, can never make a run
succeed.

Ranks that end on the time limit's warning were asked to stop: the run is not done (failed,
124, as at the limit itself), but none of them failed, whatever its exit code (the bundled
trainer saves a checkpoint and exits 128+10 on SIGUSR1). Ranks that all end with 0 after
it succeed: the program says it is done.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.record.states import RunState

FAULT_KINDS = ("rank", "disk", "lost", "script")  # what can fail first; see Detector.faults


@dataclass(frozen=True)
class Facts:
    interrupted_by: int | None = None  # the signal that stopped the controller
    first_fault: str | None = None  # one of FAULT_KINDS
    fault_code: int | None = None  # the exit code of the rank or node script that failed
    timed_out: bool = False
    any_lost: bool = False  # a node lost at any time, also during the stop
    world_succeeded: bool = False  # every rank and node script ended with exit 0
    hung: bool = False  # no rank moved for the hang timeout (hangs.py): stopped for that
    warned: bool = False  # the time limit's warning signal went to the ranks
    # warned, and every rank ended before the limit: those that did not succeed after the
    # warning, with no stop but the one that the first of them began
    all_exited_after_warning: bool = False
    # a node's processes got no answer from the store or a peer (agent/connects.py), before
    # any other stop: stopped for that
    unreachable: bool = False


def failure_code(code: int | None) -> int:
    """The exit code a failed run passes on: the rank's or script's own when it is one a
    shell can return and says failure; killed by signal N is 128 + N; otherwise 1."""
    if code is None or code == 0:
        return 1
    if code < 0:
        return 128 + -code if -code < signal.NSIG else 1
    return code if code <= 255 else 1


def _interrupted(facts: Facts) -> int:
    return 128 + (facts.interrupted_by or 0)


def _fault(facts: Facts) -> int:
    return failure_code(facts.fault_code)


def _one(facts: Facts) -> int:
    return 1


def _on_warning(facts: Facts) -> bool:
    return facts.warned and facts.all_exited_after_warning and not facts.world_succeeded


ON_WARNING = "the ranks stopped on the time limit's warning"


# (why, when it applies, state, exit code): the first row that applies decides.
TABLE: tuple[tuple[str, Callable[[Facts], bool], RunState, Callable[[Facts], int]], ...] = (
    (
        "the controller was interrupted",
        lambda f: f.interrupted_by is not None,
        RunState.STOPPED,
        _interrupted,
    ),
    (
        "a node could not reach the store or a peer",
        lambda f: f.unreachable,
        RunState.UNREACHABLE,
        _one,
    ),
    ("no rank moved for the hang timeout", lambda f: f.hung, RunState.HUNG, _one),
    (ON_WARNING, _on_warning, RunState.FAILED, lambda f: 124),
    ("a rank failed first", lambda f: f.first_fault == "rank", RunState.FAILED, _fault),
    ("a node's disk failed first", lambda f: f.first_fault == "disk", RunState.FAILED, _one),
    ("a node was lost first", lambda f: f.first_fault == "lost", RunState.LOST, _one),
    ("a node script failed first", lambda f: f.first_fault == "script", RunState.FAILED, _fault),
    ("the time limit stopped it", lambda f: f.timed_out, RunState.FAILED, lambda f: 124),
    ("a node was lost", lambda f: f.any_lost, RunState.LOST, _one),
    ("not every rank ended with exit 0", lambda f: not f.world_succeeded, RunState.FAILED, _one),
    ("every rank ended with exit 0", lambda f: True, RunState.SUCCEEDED, lambda f: 0),
)


def verdict(facts: Facts) -> tuple[RunState, int, str]:
    """(state, exit code, the table row's reason) for a run with these facts."""
    for why, applies, state, code in TABLE:
        if applies(facts):
            return state, code(facts), why
    raise AssertionError("the last row of TABLE applies to every run")
