"""The console group: how the run's stream looks on this terminal (launch, exec)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.options.declare import OptionGroup, option

COLORS = ("auto", "always", "never")


@dataclass(frozen=True)
class ConsoleOptions(OptionGroup):
    """What the console shows and how."""

    color: str = option(
        "auto",
        "Colour the rank prefixes.",
        metavar="[" + "|".join(COLORS) + "]",
        choices=COLORS,
    )
    fold: bool = option(
        True,
        "Show every line as printed. By default a line that several ranks or nodes print "
        "alike within a moment is shown once, prefixed with their host and rank lists "
        "([ceon[1-64] r[0-63]] ...); the log files always hold every line.",
        name="--no-fold",
        switch="off",
    )
    footer: bool = option(
        True,
        "No summary line under the stream. By default, on a terminal, one line under the "
        "ranks' output says how the run goes (ranks' states, step, samples/s, stragglers), "
        "as `orchestrator top` shows in full.",
        name="--no-footer",
        switch="off",
    )
