"""--time, --signal and their defaults (orchestrator/plan/deadline.py), for both backends."""

from __future__ import annotations

import pytest

from orchestrator.errors import ConfigError
from orchestrator.options.scheduler import time_limit_alias
from orchestrator.plan.deadline import (
    Deadline,
    default_warning,
    limit_seconds,
    parse_signal,
    plan_deadline,
)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1", 60),
        ("90", 5400),
        ("0:40", 40),
        ("2:30", 150),
        ("4:00:00", 14400),
        ("1-0", 86400),
        ("2-12", 216000),
        ("1-2:03", 93780),
        ("1-2:03:04", 93784),
        ("UNLIMITED", None),
        ("infinite", None),
    ],
)
def test_slurm_time_forms(value: str, seconds: int | None) -> None:
    assert limit_seconds(value) == seconds


@pytest.mark.parametrize("value", ["an hour", "1h", "1:2:3:4", "-5", "1-", "0", "0:00"])
def test_bad_time_says_which_forms_there_are(value: str) -> None:
    with pytest.raises(ConfigError, match=r"--time .*(MINUTES|above zero)"):
        limit_seconds(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("USR1@60", ("USR1", 60)),
        ("SIGUSR2@120", ("USR2", 120)),
        ("B:USR1@5", ("USR1", 5)),
        ("10@30", ("USR1", 30)),
        ("usr1@90", ("USR1", 90)),
        ("none", None),
    ],
)
def test_signal_forms(value: str, expected: tuple[str, int] | None) -> None:
    assert parse_signal(value) == expected


@pytest.mark.parametrize("value", ["TERM@60", "USR1", "USR1@0", "USR1@x", "KILL@10", "99@1"])
def test_bad_signal_says_how_to_write_it(value: str) -> None:
    with pytest.raises(ConfigError, match="USR1@SECONDS"):
        parse_signal(value)


@pytest.mark.parametrize(
    ("limit", "warning"), [(60, 15), (40, 10), (3, 1), (479, 119), (480, 120), (86400, 120)]
)
def test_default_warning_leaves_a_short_run_time_to_work(limit: int, warning: int) -> None:
    assert default_warning(limit) == warning


def test_a_limit_brings_a_warning_unless_told_otherwise() -> None:
    assert plan_deadline("1", None) == Deadline(60, "USR1", 15)
    assert plan_deadline("4:00:00", None) == Deadline(14400, "USR1", 120)
    assert plan_deadline("4:00:00", "USR2@600") == Deadline(14400, "USR2", 600)
    assert plan_deadline("1", "none") == Deadline(60)
    assert plan_deadline(None, None) == Deadline()
    assert plan_deadline(None, "USR1@300") == Deadline(None, "USR1", 300)  # the partition's
    assert plan_deadline("UNLIMITED", None) == Deadline()
    assert "SIGUSR1 to every rank 15 s before" in plan_deadline("1", None).describe()


def test_a_warning_as_long_as_the_limit_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"--signal USR1@60 with --time 1 \(60 s\).*default"):
        plan_deadline("1", "USR1@60")


@pytest.mark.parametrize(
    ("value", "as_seconds"), [("150", "2:30"), ("45", "0:45"), ("7200", "120:00"), (" 90 ", "1:30")]
)
def test_time_limit_refuses_a_bare_number_naming_both_meanings(value: str, as_seconds: str) -> None:
    number = value.strip()
    with pytest.raises(ValueError) as info:
        time_limit_alias(value)
    message = str(info.value)
    assert f"--time {as_seconds} for {number} s or --time {number} for {number} minutes" in message
    assert limit_seconds(as_seconds) == int(number)  # the form offered means what it says
    assert "\n" not in message


@pytest.mark.parametrize("value", ["2:30", "4:00:00", "1-0", "1-2:03:04", "UNLIMITED", " 0:40 "])
def test_time_limit_takes_every_other_form_as_time_does(value: str) -> None:
    assert time_limit_alias(value) == value
    assert plan_deadline(time_limit_alias(value), None) == plan_deadline(value, None)
