"""SLURM-style host lists: `node[01-04,07]` ranges expanded to host names (the hostfile
parser's), host names compressed into such a list (the console's), a set of ranks named in
the same notation (`ranks r[5-6] (node[3-4])`), and the check that a host name is one.
"""

from __future__ import annotations

import ipaddress
import itertools
import re
from collections.abc import Iterable, Mapping, Sequence

from orchestrator.numerals import MAX_DIGITS, NumberError, shown, whole_number

MAX_EXPANDED_HOSTS = 100_000
MAX_NAME, MAX_LABEL = 253, 63  # a DNS name, and each part of it between dots (RFC 1035)

_HOSTNAME = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?$")
_RANGE = re.compile(r"\[([^\[\]]*)\]")
DIGITS = re.compile(r"[0-9]+")  # ASCII only: int() refuses some Unicode digits


def expand_range(target: str, fail=None) -> list[str]:
    """Expand SLURM-style ranges: `node[01-03,07]` -> node01 node02 node03 node07."""
    fail = fail or (lambda msg: ValueError(msg))
    parts = _RANGE.split(target)
    if "[" in target and len(parts) == 1 or any("[" in p or "]" in p for p in parts[::2]):
        raise fail(f"unbalanced brackets in host {shown(target)}")
    choices: list[list[str]] = []
    total = 1
    for index, part in enumerate(parts):
        if index % 2 == 0:
            choices.append([part])
            continue
        expanded = _expand_group(part, target, fail)
        total *= len(expanded)
        if total > MAX_EXPANDED_HOSTS:
            raise fail(
                f"host range {shown(target)} expands to more than {MAX_EXPANDED_HOSTS} hosts"
            )
        choices.append(expanded)
    return ["".join(combo) for combo in itertools.product(*choices)]


def _expand_group(group: str, target: str, fail) -> list[str]:
    names: list[str] = []
    for item in group.split(","):
        lo, dash, hi = item.partition("-")
        if not DIGITS.fullmatch(lo) or (dash and not DIGITS.fullmatch(hi)):
            raise fail(f"bad range {shown(item)} in host {shown(target)}; use e.g. node[01-04,07]")
        if not dash:
            names.append(lo)
            continue
        try:
            start, stop = (
                whole_number(n, f"a range bound in host {shown(target)}") for n in (lo, hi)
            )
        except NumberError as exc:
            raise fail(str(exc)) from None
        if stop < start:
            raise fail(f"range {shown(item)} in host {shown(target)} counts down")
        if stop - start >= MAX_EXPANDED_HOSTS:
            raise fail(
                f"host range {shown(target)} expands to more than {MAX_EXPANDED_HOSTS} hosts"
            )
        width = len(lo) if lo.startswith("0") else 0
        names.extend(str(n).zfill(width) for n in range(start, stop + 1))
        if len(names) > MAX_EXPANDED_HOSTS:
            raise fail(
                f"host range {shown(target)} expands to more than {MAX_EXPANDED_HOSTS} hosts"
            )
    return names


def check_host(name: str, fail) -> str:
    if not name:
        raise fail("empty host name")
    if is_ipv6(name):
        return name
    if _HOSTNAME.fullmatch(name):
        if len(name) > MAX_NAME or any(len(label) > MAX_LABEL for label in name.split(".")):
            raise fail(
                f"host {shown(name)} is too long for a host name (at most {MAX_NAME} "
                f"characters, {MAX_LABEL} between dots)"
            )
        return name
    bad = sorted({c for c in name if not (c.isalnum() or c in "._-")})
    because = " ".join(repr(c) for c in bad) if bad else "its form"
    raise fail(
        f"host {shown(name)} is not a valid host name (because of {because}); "
        "use letters, digits, '.', '-' and '_'"
    )


def is_ipv6(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv6Address)
    except ValueError:
        return False


_NUMBERED = re.compile(r"^(.*?)(\d+)(\D*)$")


def compress_hosts(names: Iterable[str]) -> str:
    """Host names as one SLURM-style host list, in order of first appearance of each
    pattern: ceon1..ceon64 -> 'ceon[1-64]', node01 node02 node07 -> 'node[01-02,07]'.
    The inverse of expand_range for lists it made; names without a number stay whole."""
    groups: dict[tuple[str, str, int], list[int]] = {}
    order: list[tuple[str, str, int] | str] = []
    for name in dict.fromkeys(names):  # each once, in order
        match = _NUMBERED.match(name)
        if match is None:
            order.append(name)
            continue
        prefix, digits, suffix = match.groups()
        if len(digits) > MAX_DIGITS:  # a name, not a number to count with: kept whole
            order.append(name)
            continue
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        key = (prefix, suffix, width)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(digits))
    # 'node10' belongs with node01..node09 (width 2) when those are there
    for (prefix, suffix, width), numbers in list(groups.items()):
        widths = [k[2] for k in groups if k[:2] == (prefix, suffix) and k[2] > 0]
        for padded in widths if width == 0 else ():
            fits = [n for n in numbers if len(str(n)) == padded]
            groups[(prefix, suffix, padded)] += fits
            numbers[:] = [n for n in numbers if n not in fits]
    parts = []
    for item in order:
        if isinstance(item, str):
            parts.append(item)
        elif groups[item]:
            parts.append(_bracket(*item, sorted(set(groups[item]))))
    return ",".join(parts)


def _bracket(prefix: str, suffix: str, width: int, numbers: list[int]) -> str:
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][-1] + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    text = [
        f"{run[0]:0{width}d}" if len(run) == 1 else f"{run[0]:0{width}d}-{run[-1]:0{width}d}"
        for run in runs
    ]
    if len(numbers) == 1:
        return f"{prefix}{text[0]}{suffix}"
    return f"{prefix}[{','.join(text)}]{suffix}"


def name_ranks(
    ranks: Sequence[int],
    hosts: Mapping[int, str] | None = None,
    *,
    listed: int | None = None,
    counted: bool = False,
) -> str:
    """A set of ranks as the console names it, with their hosts where `hosts` knows them.

    Folded into ranges: `rank 2`, `rank 2 (node3)`, `ranks r[5-6] (node[3-4])`; `counted`,
    for a note without hosts: `4 ranks (r[0-2,5])`. With `listed` N, each rank beside its
    host, the first N, then how many more: `rank 1 on a, rank 3 on b and 12 more` (a summary
    reads which rank ran where at a glance).
    """
    hosts = hosts or {}
    if listed is not None:
        names = [f"rank {r} on {hosts[r]}" if r in hosts else f"rank {r}" for r in ranks]
        more = len(names) - listed
        return ", ".join(names[:listed]) + (f" and {more} more" if more > 0 else "")
    on = compress_hosts(sorted({hosts[r] for r in ranks if r in hosts}))
    where = f" ({on})" if on else ""
    if len(ranks) == 1:
        return f"rank {ranks[0]}{where}"
    folded = compress_hosts(f"r{r}" for r in ranks)
    if counted:
        return f"{len(ranks)} ranks ({folded}){where}"
    return f"ranks {folded}{where}"
