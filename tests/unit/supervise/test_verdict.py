"""The verdict table, every combination of the facts it reads, against the rules in words:
only a whole world succeeds, an interrupted run is stopped, a run stopped because a node
could not reach another is unreachable, a run that hung is hung, ranks
that all ended on the time limit's warning end it as the limit does (124), the first fault
names the exit code, a lost node makes a lost run unless something else came first."""

from __future__ import annotations

import itertools
import signal

import pytest

from orchestrator.supervise.verdict import FAULT_KINDS, TABLE, Facts, failure_code, verdict

SIGNALS = (None, signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
CODES = (None, 0, 3, 143, 255, 300, -9, -15)

ALL_FACTS = [
    Facts(interrupted, fault, code, timed_out, lost, world, hung, warned, after, unreachable)
    for interrupted, fault, code, timed_out, lost, world, hung, warned, after, unreachable in (
        itertools.product(
            SIGNALS,
            (None, *FAULT_KINDS),
            CODES,
            (False, True),
            (False, True),
            (False, True),
            (False, True),
            (False, True),
            (False, True),
            (False, True),
        )
    )
]


def expected(f: Facts) -> tuple[str, int]:
    """The rules, written out again without the table."""
    if f.interrupted_by is not None:
        return "stopped", 128 + f.interrupted_by
    if f.unreachable:
        return "unreachable", 1
    if f.hung:
        return "hung", 1
    if f.warned and f.all_exited_after_warning and not f.world_succeeded:
        return "failed", 124  # stopped on the warning: not done, yet no rank failed
    if f.first_fault in ("rank", "script"):
        code = f.fault_code
        if code is None or code == 0 or code > 255:
            return "failed", 1
        return "failed", 128 - code if code < 0 else code
    if f.first_fault == "disk":
        return "failed", 1
    if f.first_fault == "lost":
        return "lost", 1
    if f.timed_out:
        return "failed", 124
    if f.any_lost:
        return "lost", 1
    if not f.world_succeeded:
        return "failed", 1
    return "succeeded", 0


def test_every_combination_has_the_state_and_exit_code_the_rules_give() -> None:
    assert len(ALL_FACTS) == 4 * 5 * 8 * 2 * 2 * 2 * 2 * 2 * 2 * 2
    for facts in ALL_FACTS:
        state, code, why = verdict(facts)
        assert (state, code) == expected(facts), (facts, why)
        assert (state == "succeeded") == (code == 0), facts
        assert 0 <= code <= 255, facts


def test_only_a_whole_world_with_nothing_wrong_succeeds() -> None:
    succeeded = [f for f in ALL_FACTS if verdict(f)[0] == "succeeded"]
    assert succeeded and all(
        f.world_succeeded
        and f.interrupted_by is None
        and f.first_fault is None
        and not f.timed_out
        and not f.any_lost
        and not f.hung
        and not f.unreachable
        for f in succeeded
    )


def test_every_row_of_the_table_decides_some_run() -> None:
    reasons = {verdict(f)[2] for f in ALL_FACTS}
    assert reasons == {why for why, *_ in TABLE}


@pytest.mark.parametrize(
    ("code", "passed_on"),
    [(3, 3), (143, 143), (-9, 137), (-15, 143), (None, 1), (0, 1), (256, 1), (-200, 1)],
)
def test_failure_code(code, passed_on) -> None:
    assert failure_code(code) == passed_on
