"""How an option is declared once: a dataclass field whose metadata holds its flag, help and
bounds, and the check every group runs on its own fields at construction.

A bad value raises `ConfigError` naming the flag and the keyword (`--grace must be 0 or more,
got -5 (keyword grace)`), the same whether it came from the command line or a Python program.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.numerals import MAX_DIGITS, NumberError, shown, whole_number


@dataclass(frozen=True)
class Flag:
    """How one field appears on the command line, and what values it takes."""

    help: str
    metavar: str | None = None
    name: str | None = None  # the flag, when it is not --field-name (e.g. --identity)
    aliases: tuple[str, ...] = ()  # more spellings: -i, DeepSpeed's --num_nodes
    kind: type = str  # what click converts the text to: str, int or float
    choices: tuple[str, ...] = ()
    minimum: float | None = None  # the least value taken
    above: float | None = None  # values must be greater than this
    # A boolean's form: "on" (--flag sets True), "off" (--flag sets False; `name` says
    # which, e.g. --no-fold), "both" (--flag/--no-flag).
    switch: str | None = None
    repeat: bool = False  # given many times; a tuple of the values
    parse: Callable[[str], Any] | None = None  # text (as typed) -> the field's value
    show_default: bool = True
    nonblank: bool = False  # '' (or blanks) is refused, never taken as not given

    def flag_for(self, keyword: str) -> str:
        return self.name or "--" + keyword.replace("_", "-")


def option(default: Any, help: str, **flag: Any) -> Any:
    """A group's field that is also a flag and a keyword (see `Flag` for the settings)."""
    return field(default=default, metadata={"flag": Flag(help=help, **flag)})


def flag_of(item: dataclasses.Field) -> Flag | None:
    return item.metadata.get("flag")


def declared(group: type | object) -> Iterator[tuple[dataclasses.Field, Flag]]:
    """The fields of a group that are options, with their flags, in declaration order."""
    for item in dataclasses.fields(group):
        flag = flag_of(item)
        if flag is not None:
            yield item, flag


def keywords_of(group: type | object) -> tuple[str, ...]:
    """The keywords (field names) of a group's options, in declaration order."""
    return tuple(item.name for item, _ in declared(group))


def flag_name(group: type | object, keyword: str) -> str:
    """The flag of `keyword` in `group` (`--heartbeat-timeout` for heartbeat_timeout)."""
    for item, flag in declared(group):
        if item.name == keyword:
            return flag.flag_for(keyword)
    raise KeyError(keyword)


class OptionGroup:
    """Base of a frozen option group: checks and normalises every declared field once."""

    def __post_init__(self) -> None:
        for item, flag in declared(self):
            value = checked(item.name, flag, getattr(self, item.name))
            object.__setattr__(self, item.name, value)

    def given(self) -> list[str]:
        """The flags given a value other than their default (for messages); a default as
        typed ('auto', '1G') compares as read."""
        return [
            flag.flag_for(item.name)
            for item, flag in declared(self)
            if getattr(self, item.name) != checked(item.name, flag, item.default)
        ]


def refused(keyword: str, flag: Flag, value: Any, problem: str) -> ConfigError:
    """`--flag must be ..., got 'value' (keyword name)` or `--flag 'value': expected ...
    (keyword name)`: what, where, and what to give instead."""
    if problem.startswith("must "):
        return keyword_error(keyword, f"{flag.flag_for(keyword)} {problem}, got {shown(value)}")
    return keyword_error(keyword, f"{flag.flag_for(keyword)} {shown(value)}: {problem}")


def out_of_range(keyword: str, flag: Flag, value: float, bound: str) -> ConfigError:
    """`--flag must be <bound>, got <value> (keyword name)`."""
    return keyword_error(keyword, f"{flag.flag_for(keyword)} must be {bound}, got {value:g}")


def keyword_error(keyword: str, message: str) -> ConfigError:
    error = ConfigError(f"{message} (keyword {keyword})")
    error.keyword = keyword  # type: ignore[attr-defined]
    return error


def checked(keyword: str, flag: Flag, value: Any) -> Any:
    """`value` as the field keeps it, or the `ConfigError` that says why not."""
    if value is None:
        return None
    if flag.repeat:
        if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
            raise refused(keyword, flag, value, "expected a list of values")
        return tuple(checked_one(keyword, flag, item) for item in value)
    return checked_one(keyword, flag, value)


def checked_one(keyword: str, flag: Flag, value: Any) -> Any:
    if flag.switch is not None:
        if not isinstance(value, bool):
            raise refused(keyword, flag, value, "expected True or False")
        return value
    if flag.parse is not None:  # also given what it made: a group made again by replace()
        try:
            value = flag.parse(value)
        except ValueError as exc:
            raise refused(keyword, flag, value, str(exc)) from None
    if flag.kind in (int, float) and flag.parse is None:
        value = number(keyword, flag, value)
    elif flag.kind is str and flag.parse is None and not isinstance(value, str):
        raise refused(keyword, flag, value, "expected text")
    if flag.nonblank and isinstance(value, str) and not value.strip():
        raise keyword_error(keyword, f"{flag.flag_for(keyword)} must not be empty")
    if flag.choices and value not in flag.choices:
        raise refused(keyword, flag, value, f"choose one of {', '.join(flag.choices)}")
    return value


def whole_from_text(text: str) -> int:
    """A whole-number flag's text as the command line converts it (click's int() would
    raise past 4300 digits): signed, at most MAX_DIGITS digits; its bounds are the
    group's. NumberError saying what it takes."""
    limit = 10**MAX_DIGITS - 1
    try:
        return whole_number(text, "it", -limit, limit)
    except NumberError:
        raise NumberError(
            f"{shown(text)} is not a whole number of at most {MAX_DIGITS} digits"
        ) from None


def number(keyword: str, flag: Flag, value: Any) -> int | float:
    wanted = "a whole number" if flag.kind is int else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise refused(keyword, flag, value, f"expected {wanted}")
    if isinstance(value, float) and not math.isfinite(value):
        raise refused(keyword, flag, value, f"expected {wanted}, not {value}")
    if flag.kind is int and isinstance(value, float) and not value.is_integer():
        raise refused(keyword, flag, value, f"expected {wanted}")
    if isinstance(value, int) and abs(value) >= 10**MAX_DIGITS:  # from Python: never typed
        raise refused(keyword, flag, value, f"expected {wanted} of at most {MAX_DIGITS} digits")
    value = flag.kind(value)
    if flag.minimum is not None and value < flag.minimum:
        whole = flag.kind is int and flag.minimum == 1
        bound = "a positive integer" if whole else f"{flag.minimum:g} or more"
        raise out_of_range(keyword, flag, value, bound)
    if flag.above is not None and not value > flag.above:
        raise out_of_range(keyword, flag, value, f"more than {flag.above:g}")
    return value
