"""Frozen values (dataclasses of strings, numbers, tuples and other such dataclasses) as
plain JSON data and back, by their declared types.

A controller that follows a SLURM job leaves its job in the run record this way, so that
another one can take over (orchestrator.slurm.following.handover). JSON, not pickle: reading a run
record never runs code, whoever could write into its folder.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any


def to_plain(value: Any) -> Any:
    """`value` as JSON data: a dataclass becomes a dict of its fields, a tuple a list."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [to_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): to_plain(item) for key, item in value.items()}
    return value


def from_plain(kind: Any, data: Any) -> Any:
    """The value of type `kind` that `to_plain` made `data` of; ValueError where `data` does
    not fit `kind` (a record of another version, or edited by hand)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return from_plain(option, data)
            except (ValueError, TypeError):
                continue
        raise ValueError(f"{data!r} is none of {kind}")
    if origin is tuple:
        if not isinstance(data, list):
            raise ValueError(f"expected a list for {kind}, got {data!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_plain(args[0], item) for item in data)
        return tuple(from_plain(a, item) for a, item in zip(args, data, strict=True))
    if origin is dict:
        if not isinstance(data, dict):
            raise ValueError(f"expected a mapping for {kind}, got {data!r}")
        return {key: from_plain(args[1], item) for key, item in data.items()}
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        if not isinstance(data, dict):
            raise ValueError(f"expected a mapping for {kind.__name__}, got {data!r}")
        hints = typing.get_type_hints(kind)
        values = {
            f.name: from_plain(hints[f.name], data[f.name])
            for f in dataclasses.fields(kind)
            if f.init and f.name in data
        }
        return kind(**values)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return kind(data)
    if kind is float and isinstance(data, int) and not isinstance(data, bool):
        return float(data)
    if kind is Any or (isinstance(kind, type) and isinstance(data, kind)):
        return data
    raise ValueError(f"expected {getattr(kind, '__name__', kind)}, got {data!r}")
