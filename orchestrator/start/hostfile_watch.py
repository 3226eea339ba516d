"""A hostfile edited during a --min-nodes run: the hosts added to it since the run read it,
chosen the way the launch chose its own (the bad-node list skipped, then --include,
--exclude, --num-nodes, --num-gpus; hosts/selection.py), read with the same parser and its
errors. A broken edit is one line naming file:line, and the run goes on with what it had;
the last good reading stays the one later edits are compared with."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.errors import ConfigError
from orchestrator.hosts.hostfile import Host, load_hostfile, parse_hostfile
from orchestrator.hosts.selection import select_hosts
from orchestrator.options.choosing import Selection
from orchestrator.record.bad_nodes import skip_bad_nodes


@dataclass(frozen=True)
class Edit:
    """What one reading of an edited hostfile found: the hosts added and chosen, and the
    console's lines about it (a broken edit, hosts added but not chosen)."""

    added: tuple[Host, ...] = ()
    lines: tuple[str, ...] = ()


class HostfileWatch:
    """The hostfile a run was launched from, read again when its text changes."""

    def __init__(
        self, path: str, text: str, names: frozenset[str], hosts: Selection, nproc: int | None
    ) -> None:
        self.path, self.text, self.names = path, text, names
        self.hosts, self.nproc = hosts, nproc

    @classmethod
    def of(cls, path: str, hosts: Selection, nproc: int | None) -> HostfileWatch | None:
        """The watch of the file at `path` as it is now (None when it cannot be read: the
        launch read it a moment ago, so it was moved or broken since, and nothing is
        watched). `hosts`: the launch's choice; `nproc`: --nproc-per-node."""
        text = read_text(path)
        try:
            cluster = parse_hostfile(text or "", path)
        except ConfigError:
            return None
        return cls(path, text or "", frozenset(h.name for h in cluster.hosts), hosts, nproc)

    def read(self) -> Edit:
        """The hosts added since the last good reading, if the file changed; never raises."""
        text = read_text(self.path)
        if text == self.text:
            return Edit()
        self.text = text or ""
        try:
            # the same parser as the launch's; load_hostfile says why a file cannot be read
            cluster = load_hostfile(self.path) if text is None else parse_hostfile(text, self.path)
            kept, skipped = skip_bad_nodes(cluster, self.hosts.bad_nodes)
            chosen = select_hosts(kept, self.hosts, self.nproc)
        except ConfigError as exc:  # SourceError: path:line: what is wrong
            return Edit(lines=(f"{exc} (the edit is not taken; the run goes on with its hosts)",))
        names, self.names = self.names, frozenset(h.name for h in cluster.hosts)
        added = tuple(h for h in chosen.hosts if h.name not in names)
        lines = []
        if bad := [name for name in skipped if name not in names]:
            lines.append(
                f"{self.path}: {', '.join(bad)} added, but on the bad-node list "
                f"{self.hosts.bad_nodes}: not taken (remove its line there to use it)"
            )
        taken = names | {h.name for h in chosen.hosts}
        if unchosen := [h.name for h in kept.hosts if h.name not in taken]:
            lines.append(
                f"{self.path}: {', '.join(unchosen)} added, but not chosen by "
                f"{self.hosts.describe()}: not taken"
            )
        return Edit(added, tuple(lines))


def read_text(path: str) -> str | None:
    """The file's text, or None when it cannot be read now (an editor replacing it)."""
    try:
        with open(path, encoding="utf-8-sig") as file:
            return file.read()
    except (OSError, UnicodeDecodeError):
        return None
