"""Hostfiles: one parser for every format users bring, producing a `Cluster`.

Text formats, one host (or host range) per line, `#` starts a comment:

    node1 slots=8                 DeepSpeed / OpenMPI; also max_slots=N port=N user=U
                                  ifname=I python=P
    node2:8                       MPICH
    node3                         bare host (runs --nproc-per-node ranks, default 1)
    alice@node4 port=2222         user and port
    node[01-04,07] slots=8        SLURM-style ranges, zero padding kept

YAML (by suffix .yaml/.yml, or when the file starts like YAML): a list of mappings, or a
mapping with `hosts:` (a list) and optional `defaults:`; fields host, slots, max_slots,
user, port, ifname, python. Such a mapping may also say the job's container (`container:`
with image, runtime, mounts, workdir, args, python; orchestrator.plan.container checks
them), which the launch's --container flags override.

There is no fallback: a missing or empty hostfile is an error, never "one local node".
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import SourceError
from orchestrator.hostlist import check_host, expand_range, is_ipv6
from orchestrator.numerals import MAX_SLOTS, PORT, NumberError, shown, whole_number

if TYPE_CHECKING:
    import yaml  # imported where YAML hostfiles are read: the others need not pay ~20 ms

LOCAL_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "localhost.localdomain"})

# Fields a host may carry, in hostfile order; the YAML keys and the text `key=value` keys.
FIELDS = ("host", "slots", "max_slots", "user", "port", "ifname", "python")
_TEXT_KEYS = {"slots", "max_slots", "max-slots", "user", "port", "ifname", "python"}

_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9._-]*$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.:@,^=-]{1,64}$")


@dataclass(frozen=True)
class Host:
    """One node as the hostfile describes it."""

    name: str
    slots: int | None = None
    max_slots: int | None = None
    user: str | None = None
    port: int | None = None
    ifname: str | None = None
    python: str | None = None
    source: str = ""  # "path:line", for messages
    # Set by a selection (--include/--exclude/--num-gpus, orchestrator.hosts.selection), never
    # by the hostfile: the slot ids this node runs, its CUDA_VISIBLE_DEVICES.
    slot_ids: tuple[int, ...] | None = None

    @property
    def is_local(self) -> bool:
        """This machine: localhost, 127.0.0.0/8 or ::1 (run without SSH)."""
        if self.name.lower() in LOCAL_NAMES:
            return True
        try:
            return ipaddress.ip_address(self.name).is_loopback
        except ValueError:
            return False


@dataclass(frozen=True)
class Cluster:
    """The hosts of a hostfile, in order; node_rank follows this order."""

    hosts: tuple[Host, ...]
    path: str
    selection: str = ""  # the selection flags that chose these hosts (orchestrator.hosts.selection)
    spares: tuple[Host, ...] = ()  # --spares: held back, not started (orchestrator.start.pool)
    # A YAML hostfile's `container:`, as read ((key, value) pairs, a value a string or a
    # tuple of strings), and where it is ("path:line"); orchestrator.plan.container checks it.
    container: tuple[tuple[str, str | tuple[str, ...]], ...] | None = None
    container_source: str = ""

    @property
    def is_local(self) -> bool:
        return all(h.is_local for h in self.hosts)


def load_hostfile(path: str | Path) -> Cluster:
    """Read and parse a hostfile; every problem is a `SourceError` naming file and line."""
    shown = str(path)
    p = Path(path)
    if not p.exists():
        raise SourceError(
            shown,
            None,
            "hostfile not found; pass the path of a hostfile (see hostfiles/ for examples)",
        )
    if p.is_dir():
        raise SourceError(shown, None, "is a directory, not a hostfile")
    try:
        text = p.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(shown, None, f"cannot read hostfile: {exc}") from None
    return parse_hostfile(text, shown)


def parse_hostfile(text: str, path: str = "<hostfile>") -> Cluster:
    """Parse hostfile text (text or YAML form) into a `Cluster`."""
    if "\x00" in text:
        raise SourceError(path, None, "hostfile contains a NUL byte; is it a binary file?")
    container, source = None, ""
    if _looks_like_yaml(text, path):
        hosts, container, source = _parse_yaml(text, path)
    else:
        hosts = _parse_text(text, path)
    if not hosts:
        raise SourceError(
            path,
            None,
            "no hosts in hostfile; add a line such as "
            "'node1 slots=8' (there is no fallback to localhost)",
        )
    _check_duplicates(hosts, path)
    return Cluster(hosts=tuple(hosts), path=path, container=container, container_source=source)


def _looks_like_yaml(text: str, path: str) -> bool:
    if path.endswith((".yaml", ".yml")):
        return True
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return stripped.startswith(("- ", "hosts:", "defaults:", "---")) or stripped == "-"
    return False


# --- text form ---------------------------------------------------------------------------


def _parse_text(text: str, path: str) -> list[Host]:
    hosts: list[Host] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if line:
            hosts.extend(_parse_text_line(line, path, lineno))
    return hosts


def _parse_text_line(line: str, path: str, lineno: int) -> list[Host]:
    def fail(msg: str) -> SourceError:
        return SourceError(path, lineno, f"{msg} (in {shown(line)})")

    tokens = line.split()
    target, fields = tokens[0], tokens[1:]
    if "=" in target:
        raise fail("a line must start with the host name, e.g. 'node1 slots=8'")
    values: dict[str, object] = {}
    if "@" in target:
        user, _, target = target.rpartition("@")
        values["user"] = user
    target, mpich_slots = _split_mpich(target, fail)
    if mpich_slots is not None:
        values["slots"] = mpich_slots
    for field in fields:
        key, sep, value = field.partition("=")
        if not sep:
            raise fail(
                f"expected key=value, got {field!r}; valid keys: "
                f"{', '.join(sorted(_TEXT_KEYS - {'max-slots'}))}"
            )
        key = key.replace("-", "_")
        if key not in _TEXT_KEYS:
            raise fail(
                f"unknown key {key!r}; valid keys: {', '.join(sorted(_TEXT_KEYS - {'max-slots'}))}"
            )
        if key in values:
            raise fail(f"{key} given twice")
        values[key] = value
    return _make_hosts(target, values, path, lineno, fail)


def _split_mpich(target: str, fail) -> tuple[str, str | None]:
    """Split MPICH `host:N` (and `[v6addr]:N`); a bare IPv6 address has no slot suffix."""
    if target.startswith("["):
        addr, close, rest = target[1:].partition("]")
        if close and is_ipv6(addr):
            if rest and not rest.startswith(":"):
                raise fail(f"unexpected {rest!r} after [{addr}]")
            return addr, (rest[1:] if rest else None)
        return target, None  # a range such as [01-04]node is checked later
    if target.count(":") == 1:
        host, _, slots = target.partition(":")
        return host, slots
    if target.count(":") > 1 and not is_ipv6(target):
        raise fail(f"{target!r} is neither host:N nor an IPv6 address")
    return target, None


# --- YAML form ---------------------------------------------------------------------------


def _parse_yaml(
    text: str, path: str
) -> tuple[list[Host], tuple[tuple[str, str | tuple[str, ...]], ...] | None, str]:
    """The hosts, and the `container:` (as Cluster keeps it) with where it is ("path:line")."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:  # PyYAML composes nested collections recursively
        raise SourceError(path, None, "invalid YAML: nested too deeply") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise SourceError(path, line, f"invalid YAML: {problem}") from None
    if root is None or (isinstance(root, yaml.ScalarNode) and root.tag.endswith(":null")):
        return [], None, ""  # an empty document, e.g. only '---'
    defaults: dict[str, object] = {}
    container, source = None, ""
    entries = root
    if isinstance(root, yaml.MappingNode):
        top = _mapping(root, path)
        unknown = set(top) - {"hosts", "defaults", "container"}
        if unknown:
            key = sorted(unknown)[0]
            raise SourceError(
                path,
                top[key][0].start_mark.line + 1,
                f"unknown top-level key {key!r}; valid keys: container, defaults, hosts",
            )
        if "container" in top:
            key, value = top["container"]
            container = _container_values(value, path)
            source = f"{path}:{key.start_mark.line + 1}"
        if "defaults" in top:
            defaults = _entry_values(top["defaults"][1], path, allow_host=False)
        if "hosts" not in top:
            raise SourceError(path, root.start_mark.line + 1, "missing 'hosts:' list")
        entries = top["hosts"][1]
    if not isinstance(entries, yaml.SequenceNode):
        raise SourceError(
            path, entries.start_mark.line + 1, "expected a list of hosts ('- host: node1')"
        )
    hosts: list[Host] = []
    for item in entries.value:
        lineno = item.start_mark.line + 1
        if isinstance(item, yaml.ScalarNode):
            values: dict[str, object] = {"host": item.value}
        else:
            values = _entry_values(item, path, allow_host=True)
        if "host" not in values:
            raise SourceError(path, lineno, "entry has no 'host' field")
        merged = {**defaults, **values}
        target = str(merged.pop("host"))

        def fail(msg: str, lineno: int = lineno) -> SourceError:
            return SourceError(path, lineno, msg)

        hosts.extend(_make_hosts(target, merged, path, lineno, fail))
    return hosts, container, source


def _container_values(node: yaml.Node, path: str) -> tuple[tuple[str, str | tuple[str, ...]], ...]:
    """`container:` as (key, value) pairs: each field one value, or (mounts, args) a list."""
    import yaml

    values: dict[str, str | tuple[str, ...]] = {}
    for name, (_, value) in _mapping(node, path).items():
        if isinstance(value, yaml.SequenceNode) and all(
            isinstance(item, yaml.ScalarNode) for item in value.value
        ):
            values[name] = tuple(item.value for item in value.value)
        elif isinstance(value, yaml.ScalarNode) and not value.tag.endswith(":null"):
            values[name] = value.value
        else:
            raise SourceError(
                path, value.start_mark.line + 1, f"container {name} must be a value or a list"
            )
    return tuple(values.items())


def _mapping(node: yaml.Node, path: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    import yaml

    if not isinstance(node, yaml.MappingNode):
        raise SourceError(path, node.start_mark.line + 1, "expected a mapping of fields")
    result: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for key, value in node.value:
        if not isinstance(key, yaml.ScalarNode):
            raise SourceError(path, key.start_mark.line + 1, "field names must be plain words")
        if key.value in result:
            raise SourceError(path, key.start_mark.line + 1, f"{key.value} given twice")
        result[key.value] = (key, value)
    return result


def _entry_values(node: yaml.Node, path: str, *, allow_host: bool) -> dict[str, object]:
    import yaml

    valid = FIELDS if allow_host else FIELDS[1:]
    values: dict[str, object] = {}
    for name, (key, value) in _mapping(node, path).items():
        if name not in valid:
            raise SourceError(
                path,
                key.start_mark.line + 1,
                f"unknown key {name!r}; valid keys: {', '.join(valid)}",
            )
        if not isinstance(value, yaml.ScalarNode) or value.tag.endswith(":null"):
            raise SourceError(path, value.start_mark.line + 1, f"{name} must be a single value")
        values[name] = value.value
    return values


# --- shared: validation ------------------------------------------------------------------


def _make_hosts(target: str, values: dict[str, object], path: str, lineno: int, fail) -> list[Host]:
    fields = {
        "slots": _slots(values.get("slots"), "slots", fail),
        "max_slots": _slots(values.get("max_slots"), "max_slots", fail),
        "port": _port(values.get("port"), fail),
        "user": _checked(values.get("user"), _USER, "user name", fail),
        "ifname": _checked(values.get("ifname"), _IFNAME, "interface name", fail),
        "python": _python(values.get("python"), fail),
    }
    slots, max_slots = fields["slots"], fields["max_slots"]
    if slots is not None and max_slots is not None and max_slots < slots:
        raise fail(f"max_slots={max_slots} is smaller than slots={slots}")
    template = Host(name="", source=f"{path}:{lineno}", **fields)  # type: ignore[arg-type]
    return [replace(template, name=check_host(name, fail)) for name in expand_range(target, fail)]


def _slots(value: object, name: str, fail) -> int | None:
    if value is None:
        return None
    try:
        return whole_number(value, name, 1, MAX_SLOTS)
    except NumberError as exc:
        raise fail(str(exc)) from None


def _port(value: object, fail) -> int | None:
    if value is None:
        return None
    try:
        return whole_number(value, "port", *PORT)
    except NumberError as exc:
        raise fail(str(exc)) from None


def _checked(value: object, pattern: re.Pattern[str], what: str, fail) -> str | None:
    if value is None:
        return None
    text = str(value)
    if not pattern.fullmatch(text):
        raise fail(f"{text!r} is not a valid {what}")
    return text


def _python(value: object, fail) -> str | None:
    if value is None:
        return None
    text = str(value)
    if not text.strip() or any(ord(c) < 32 or c == "\x7f" for c in text):
        raise fail(f"python {text!r} must be a path to an interpreter, without control chars")
    return text


def _machine(host: Host) -> str:
    """This machine for localhost, 127.0.0.1 and ::1 however written; any other loopback
    address is a node of its own here (a simulated cluster, benchmarks/scale_harness.py)."""
    if host.name.lower() in LOCAL_NAMES:
        return "localhost"
    try:
        ip = ipaddress.ip_address(host.name)
    except ValueError:
        return host.name
    ip = getattr(ip, "ipv4_mapped", None) or ip
    return "localhost" if str(ip) in LOCAL_NAMES else str(ip)


def _check_duplicates(hosts: list[Host], path: str) -> None:
    seen: dict[tuple[str, int | None], Host] = {}
    for host in hosts:
        key = (_machine(host), host.port)
        if key in seen:
            first = seen[key]
            line = int(host.source.rsplit(":", 1)[1])
            raise SourceError(
                path,
                line,
                f"duplicate host {host.name!r} (first at "
                f"{first.source}); list each node once and set slots=N for "
                "several ranks",
            )
        seen[key] = host
