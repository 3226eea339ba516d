"""SLURM-style host lists: `node[01-04,07]` ranges expanded to host names, and the check that
a host name is one. Used by the hostfile parser (orchestrator.hostfile).
"""

from __future__ import annotations

import ipaddress
import itertools
import re

MAX_EXPANDED_HOSTS = 100_000

_HOSTNAME = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?$")
_RANGE = re.compile(r"\[([^\[\]]*)\]")
DIGITS = re.compile(r"[0-9]+")  # ASCII only: int() refuses some Unicode digits


def expand_range(target: str, fail=None) -> list[str]:
    """Expand SLURM-style ranges: `node[01-03,07]` -> node01 node02 node03 node07."""
    fail = fail or (lambda msg: ValueError(msg))
    parts = _RANGE.split(target)
    if "[" in target and len(parts) == 1 or any("[" in p or "]" in p for p in parts[::2]):
        raise fail(f"unbalanced brackets in host {target!r}")
    choices: list[list[str]] = []
    total = 1
    for index, part in enumerate(parts):
        if index % 2 == 0:
            choices.append([part])
            continue
        expanded = _expand_group(part, target, fail)
        total *= len(expanded)
        if total > MAX_EXPANDED_HOSTS:
            raise fail(f"host range {target!r} expands to more than {MAX_EXPANDED_HOSTS} hosts")
        choices.append(expanded)
    return ["".join(combo) for combo in itertools.product(*choices)]


def _expand_group(group: str, target: str, fail) -> list[str]:
    names: list[str] = []
    for item in group.split(","):
        lo, dash, hi = item.partition("-")
        if not DIGITS.fullmatch(lo) or (dash and not DIGITS.fullmatch(hi)):
            raise fail(f"bad range {item!r} in host {target!r}; use e.g. node[01-04,07]")
        if not dash:
            names.append(lo)
            continue
        start, stop = int(lo), int(hi)
        if stop < start:
            raise fail(f"range {item!r} in host {target!r} counts down")
        if stop - start >= MAX_EXPANDED_HOSTS:
            raise fail(f"host range {target!r} expands to more than {MAX_EXPANDED_HOSTS} hosts")
        width = len(lo) if lo.startswith("0") else 0
        names.extend(str(n).zfill(width) for n in range(start, stop + 1))
        if len(names) > MAX_EXPANDED_HOSTS:
            raise fail(f"host range {target!r} expands to more than {MAX_EXPANDED_HOSTS} hosts")
    return names


def check_host(name: str, fail) -> str:
    if not name:
        raise fail("empty host name")
    if _HOSTNAME.fullmatch(name) or is_ipv6(name):
        return name
    bad = sorted({c for c in name if not (c.isalnum() or c in "._-")})
    shown = " ".join(repr(c) for c in bad) if bad else "its form"
    raise fail(
        f"host {name!r} is not a valid host name (because of {shown}); "
        "use letters, digits, '.', '-' and '_'"
    )


def is_ipv6(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv6Address)
    except ValueError:
        return False
