"""A run's deadline: its time limit (`--time`), the warning signal ahead of it (`--signal`),
and how often a SLURM run is carried past a limit (`--max-resubmits`). Pure; one source for
both backends.

`--time` takes SLURM's forms on every backend: MINUTES, MINUTES:SECONDS, HH:MM:SS,
DAYS-HH, DAYS-HH:MM, DAYS-HH:MM:SS (UNLIMITED/INFINITE: none). With a limit and no
`--signal`, the ranks get SIGUSR1 `default_warning(limit)` seconds before it: 120 s (time
for a checkpoint of a few GB to a shared file system), a quarter of a limit under 8
minutes, so that a short run still works before it is warned. `--signal none` sends none.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from orchestrator.errors import ConfigError
from orchestrator.numerals import MAX_DIGITS, NumberError, shown, whole_number

DEFAULT_WARNING_S = 120
SHORT_LIMIT_SHARE = 4  # a limit under 4 x 120 s is warned a quarter of it ahead
FORWARDABLE_SIGNALS = ("USR1", "USR2")  # torchrun and the wrappers can ignore these safely
# A run with --resume is expected to go on to its end unattended: 10 attempts carry a
# 10-day run across a 24-hour partition limit; the bound only stops a program that never
# saves (or never reads) a checkpoint from starting over forever.
DEFAULT_RESUBMITS = 10
_TIME = re.compile(
    r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d{1,2})(?::(?P<ds>\d{1,2}))?)?"
    r"|(?P<a>\d+)(?::(?P<b>\d{1,2})(?::(?P<c>\d{1,2}))?)?)$"
)
_SIGNAL = re.compile(r"^(?:B:)?(?:SIG)?([A-Z0-9]+)@(\d+)$", re.IGNORECASE)
UNLIMITED = ("UNLIMITED", "INFINITE")


def limit_seconds(value: str, flag: str = "--time") -> int | None:
    """SLURM's time forms -> seconds (None: unlimited); a bad one is a ConfigError."""
    text = value.strip()
    if text.upper() in UNLIMITED:
        return None
    match = _TIME.match(text)
    if match is None:
        raise ConfigError(
            f"{flag} {shown(value)}: expected a time limit: MINUTES, MINUTES:SECONDS, HH:MM:SS or "
            "DAYS-HH[:MM[:SS]] (SLURM's forms; e.g. 90, 4:00:00, 2-00)"
        )
    try:
        g = {k: whole_number(v, "a number") for k, v in match.groupdict().items() if v}
    except NumberError:
        raise ConfigError(
            f"{flag} {shown(value)}: a number in it has more than {MAX_DIGITS} digits"
        ) from None
    if "days" in g:
        seconds = ((g["days"] * 24 + g["dh"]) * 60 + g.get("dm", 0)) * 60 + g.get("ds", 0)
    elif "c" in g:
        seconds = (g["a"] * 60 + g["b"]) * 60 + g["c"]
    else:
        seconds = g["a"] * 60 + g.get("b", 0)
    if seconds <= 0:
        raise ConfigError(f"{flag} {shown(value)}: a time limit must be above zero")
    return seconds


def parse_signal(value: str) -> tuple[str, int] | None:
    """--signal USR1@60 -> ("USR1", 60): the signal and how long before the time limit;
    "none" -> None (no warning)."""
    if value.strip().lower() == "none":
        return None
    match = _SIGNAL.match(value.strip())
    name = match.group(1).upper() if match else ""
    if name.isdigit():
        try:
            name = signal.Signals(whole_number(name, "a signal number")).name[3:]
        except ValueError:  # NumberError too
            name = ""
    try:
        seconds = whole_number(match.group(2), "SECONDS", 1, 65535) if match else None
    except NumberError:
        seconds = None
    if seconds is None or name not in FORWARDABLE_SIGNALS:
        raise ConfigError(
            f"--signal {shown(value)}: expected USR1@SECONDS or USR2@SECONDS, SECONDS from "
            "1 to 65535 (e.g. USR1@120: SIGUSR1 to the ranks 120 s before the time limit), "
            "or none"
        )
    return name, seconds


def default_warning(limit_s: int) -> int:
    """How long before a limit of `limit_s` the ranks are warned when --signal is not given."""
    return max(1, min(DEFAULT_WARNING_S, limit_s // SHORT_LIMIT_SHARE))


@dataclass(frozen=True)
class Deadline:
    """The limit (None: none), and the signal sent `warning_s` before it (None: none)."""

    limit_s: int | None = None
    signal_name: str | None = None
    warning_s: int | None = None

    def describe(self) -> str:
        """One line for plan.yaml and the console."""
        if self.limit_s is None and self.signal_name is None:
            return "none"
        limit = f"{self.limit_s} s" if self.limit_s is not None else "the partition's"
        if self.signal_name is None:
            return f"time limit {limit}, no warning signal"
        return f"time limit {limit}; SIG{self.signal_name} to every rank {self.warning_s} s before"


def plan_deadline(time: str | None, signal_value: str | None) -> Deadline:
    """The deadline that --time and --signal ask for (both checked here)."""
    limit = limit_seconds(time) if time else None
    if signal_value is not None:
        chosen = parse_signal(signal_value)
        if chosen is None:
            return Deadline(limit)
        name, seconds = chosen
        if limit is not None and seconds >= limit:
            raise ConfigError(
                f"--signal {signal_value} with --time {time} ({limit} s): the warning would "
                f"come before the run starts; give fewer seconds than the limit (the default "
                f"for this limit is {default_warning(limit)})"
            )
        return Deadline(limit, name, seconds)
    if limit is None:
        return Deadline()
    return Deadline(limit, "USR1", default_warning(limit))
