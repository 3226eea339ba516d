"""The command line's options, made from the option groups' fields (orchestrator/options/):
a flag's name, default, help and form are declared once, on its field; its bounds are
checked by the group, so a bad value reads the same from the command line and from Python.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import click

from orchestrator.options.declare import Flag, OptionGroup, declared, whole_from_text
from orchestrator.options.display import ConsoleOptions
from orchestrator.options.running import RunOptions

Decorator = Callable[[Callable], Callable]


def note(text: str) -> None:
    """A note for the user, on stderr: `[orchestrator] text`."""
    click.echo(f"[orchestrator] {text}", err=True)


def options_of(
    group: type[OptionGroup],
    only: Iterable[str] | None = None,
    *,
    helps: Mapping[str, str] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> Decorator:
    """The click options of `group`'s fields (of `only` those, in the group's order).
    `helps` and `defaults`: a command whose flag means something else there (`check`'s
    --master-port, `exec`'s --grace) says so, by keyword."""
    chosen = None if only is None else set(only)
    options = [
        click_option(item.name, flag, (defaults or {}).get(item.name, item.default), helps)
        for item, flag in declared(group)
        if chosen is None or item.name in chosen
    ]
    return lambda func: functools.reduce(lambda f, option: option(f), reversed(options), func)


class WholeNumber(click.ParamType):
    """An int flag's type: click's INT, but text of any length is a value or one line."""

    name = "integer"

    def __init__(self, minimum: int | None = None) -> None:
        self.minimum = minimum  # for a flag no option group checks (logs --tail)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None):
        try:
            number = value if isinstance(value, int) else whole_from_text(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if self.minimum is not None and number < self.minimum:
            self.fail(f"must be {self.minimum} or more, got {number}", param, ctx)
        return number


def click_option(
    keyword: str, flag: Flag, default: Any, helps: Mapping[str, str] | None
) -> Decorator:
    """One field as click declares it: the value reaches the command under its keyword."""
    text = (helps or {}).get(keyword, flag.help)
    names = [flag.flag_for(keyword), *flag.aliases, keyword]
    settings: dict[str, Any] = {"help": text}
    if flag.switch == "both":
        negative = "--no-" + flag.flag_for(keyword).removeprefix("--")
        names = [f"{flag.flag_for(keyword)}/{negative}", keyword]
        settings.update(default=default, show_default=True)
    elif flag.switch is not None:
        # "on": the flag sets True; "off" (--no-fold): it sets False, the default True
        settings.update(is_flag=True, flag_value=flag.switch == "on", default=default)
    else:
        settings.update(
            type=WholeNumber() if flag.kind is int else flag.kind,
            default=default,
            metavar=flag.metavar,
            multiple=flag.repeat,
            show_default=flag.show_default and default not in (None, ()),
        )
    return click.option(*names, **settings)


run_dir_option = options_of(RunOptions, ["run_dir"])
fold_option = options_of(ConsoleOptions, ["fold"])
