"""Folding the console: a line that many ranks (or nodes) print alike is shown once.

A line is held for a short window; the ranks that print the same text within it join it,
and it is shown once with their host list and rank list in the SLURM syntax the hostfile
reads: `[ceon[1-64] r[0-63]] hello`. A line no other rank prints is shown as it would be
unfolded, one window late. Ranks rarely start together at scale, so copies of a text that
come after it was shown join one more line for that text, shown once they stop coming for
a while (or after a longest wait), and each time such a line is shown the next one waits
twice as long (up to 16x): the warning that each of 256 nodes' torch printed once, over
three minutes, shows 8 times (a 256-node run's record replayed), not 51 as at a fixed wait.

The orchestrator's own lines about one node (`[orchestrator] ceon3: stopping (stop
requested)`) fold the same way across nodes: `[orchestrator] ceon[1-16]: stopping ...`.

Lines that differ only in a leading time stamp (torch's `[W1125 13:34:54.336425368
socket.cpp:207] ...`, logging's `2026-11-25 13:34:54,336 ...`) count as alike; the folded
line shows the first copy's stamp.

Each rank's own lines keep their order on the console: showing a line first shows the
held lines of its ranks that came before it. Only the console is folded; the run record
keeps every line as printed.

Times are whatever clock the caller counts in (`now`): seconds for a live stream, line
numbers for a log file read back.
"""

from __future__ import annotations

import re
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable

from orchestrator.hostlist import compress_hosts

WINDOW_S = 0.25  # how long a new line waits for copies; the most a distinct line is held
QUIET_S = 1.0  # late copies of a shown line: shown once none came for this long
LONGEST_S = 5.0  # ... or this long after the first of them
RECENT_S = 10.0  # a text shown this recently gathers late copies instead of a new window
BACKOFF_MAX = 4  # QUIET/LONGEST double each time a text's late copies are shown, up to 2**4

ORCHESTRATOR = b"[orchestrator] "  # the prefix of the orchestrator's own lines
# a time stamp at the start of a line: glog/c10 (`W1125 13:34:54.336425 [thread]`) or ISO 8601
_STAMP = re.compile(
    rb"^\[?(?:[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+(?: +\d+)?"
    rb"|\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)"
)
_STAMP_FIRST = frozenset(b"[IWEF0123456789")  # the first bytes a stamp may start with
_PREFIX = re.compile(rb"\[([^\]\s]+)(?: r(\d+))?\] ")


class _Group:
    """One console line in waiting: a text and the sources (prefixes) that printed it.
    (A plain class with slots: one is made for every line, so it is kept cheap.)"""

    __slots__ = (
        "done",
        "joined",
        "key",
        "kind",
        "last",
        "late",
        "members",
        "opened",
        "seq",
        "text",
    )

    def __init__(
        self, text: bytes, key: tuple[str, bytes], kind: str, opened: float, late: bool, seq: int
    ) -> None:
        self.text = text  # as the first copy printed it
        self.key = key  # what copies share: the kind and the text without a time stamp
        self.kind = kind  # a rank's line, a node's, or a note of ours about a node
        self.opened = opened
        self.late = late  # copies of a text shown recently: wait for QUIET/LONGEST, not WINDOW
        self.seq = seq  # order opened: a source joins only groups opened after its waiting ones
        self.last = opened
        self.members: list[bytes] = []
        self.joined: set[bytes] = set()
        self.done = False


def split_prefix(line: bytes) -> tuple[bytes, bytes] | None:
    """`[ceon1 r0] text` -> (b'[ceon1 r0] ', b'text'); None for a line without one."""
    match = _PREFIX.match(line)
    if match is None:
        return None
    return line[: match.end()], line[match.end() :]


class Folder:
    """Gathers prefixed lines and shows each text once per group of sources.

    `show(prefix, text, folded)` prints one line; `folded` is True when the prefix names
    several sources.
    """

    def __init__(
        self,
        show: Callable[[bytes, bytes, bool], None],
        window: float = WINDOW_S,
        quiet: float = QUIET_S,
        longest: float = LONGEST_S,
        recent: float = RECENT_S,
    ) -> None:
        self.show = show
        self.window, self.quiet, self.longest, self.recent = window, quiet, longest, recent
        self.open: dict[tuple[str, bytes], _Group] = {}  # the group a new copy joins
        self.firsts: deque[_Group] = deque()  # due in the order opened
        self.lates: list[_Group] = []
        self.pending: dict[bytes, deque[_Group]] = {}  # a source's waiting lines, in order
        self.shown: OrderedDict[tuple[str, bytes], float] = OrderedDict()
        # texts whose late copies were shown: (how often, up to BACKOFF_MAX; the last copy)
        self.backoff: OrderedDict[tuple[str, bytes], tuple[int, float]] = OrderedDict()
        self.labels: dict[bytes, tuple[str, int | None]] = {}
        self.kinds: dict[bytes, str] = {}  # a source's kind of line: "rank" or "node"
        self.opened = 0

    def _label(self, prefix: bytes) -> tuple[str, int | None]:
        label = self.labels.get(prefix)
        if label is None:
            match = _PREFIX.match(prefix)
            if match is None:
                label = (prefix.decode(errors="replace").strip("[] "), None)
            else:
                host, rank = match.groups()
                label = (host.decode(errors="replace"), int(rank) if rank else None)
            self.labels[prefix] = label
        return label

    def add(self, now: float, prefix: bytes, text: bytes, about: str | None = None) -> None:
        """One whole line (`text` ends with its newline) from the source `prefix`; with
        `about`, a note of ours about that host (`prefix` is `[orchestrator] HOST: `)."""
        if about is not None:
            self.labels[prefix] = (about, None)
        self.add_lines(now, prefix, (text,), "note" if about is not None else None)

    def add_lines(
        self, now: float, prefix: bytes, lines: Iterable[bytes], kind: str | None = None
    ) -> None:
        """Whole lines from the source `prefix`, in order (one chunk of a rank's output:
        what is the same for every line is looked up once, since this runs per line)."""
        if kind is None:
            kind = self.kinds.get(prefix)
            if kind is None:
                kind = self.kinds[prefix] = "rank" if self._label(prefix)[1] is not None else "node"
        open_groups, shown, recent = self.open, self.shown, self.recent
        waiting = self.pending.get(prefix)
        if waiting is None:
            waiting = self.pending[prefix] = deque()
        for text in lines:
            stamped = text[:1] and text[0] in _STAMP_FIRST  # most lines cannot start with one
            key = (kind, _STAMP.sub(b"", text, count=1) if stamped else text)
            group = open_groups.get(key)
            if (
                group is None
                or group.done
                or prefix in group.joined
                or (waiting and waiting[-1].seq > group.seq)  # it would show before an earlier
            ):
                seen = shown.get(key)
                late = seen is not None and now - seen <= recent
                if not late and self.backoff:  # a text shown late waits longer to be new again
                    backoff = self.backoff.get(key)
                    late = backoff is not None and now - backoff[1] <= recent * (1 << backoff[0])
                self.opened += 1
                group = open_groups[key] = _Group(text, key, kind, now, late, self.opened)
                (self.lates.append if late else self.firsts.append)(group)
            group.members.append(prefix)
            group.joined.add(prefix)
            group.last = now
            waiting.append(group)
            shown[key] = now
            shown.move_to_end(key)

    def holding(self) -> bool:
        """Whether any line waits to be shown."""
        return bool(self.firsts or self.lates)

    def release(self, now: float) -> None:
        """Show every line whose wait is over."""
        while self.firsts and (self.firsts[0].done or now - self.firsts[0].opened >= self.window):
            self._emit(self.firsts.popleft())
        if self.lates:
            for group in [g for g in self.lates if self._late_due(g, now)]:
                self._emit(group)
            self.lates = [g for g in self.lates if not g.done]
        while self.shown:
            key, when = next(iter(self.shown.items()))
            if now - when <= self.recent:
                break
            self.shown.popitem(last=False)
        while self.backoff:
            _level, last = next(iter(self.backoff.values()))
            if now - last <= self.recent * (1 << BACKOFF_MAX):
                break
            self.backoff.popitem(last=False)

    def _late_due(self, group: _Group, now: float) -> bool:
        if group.done:
            return True
        scale = 1 << self.backoff.get(group.key, (0, 0.0))[0]
        return min(group.last + self.quiet * scale, group.opened + self.longest * scale) <= now

    def drain(self) -> None:
        """Show everything held, in order (before a line of our own, and at the end)."""
        while self.firsts or self.lates:
            first = self.firsts[0] if self.firsts else None
            late = self.lates[0] if self.lates else None
            if late is None or (first is not None and first.opened <= late.opened):
                self._emit(self.firsts.popleft())
            else:
                self._emit(self.lates.pop(0))
        self.shown.clear()
        self.backoff.clear()

    def _emit(self, group: _Group) -> None:
        """Show `group`, after the lines its sources printed before it."""
        members = group.members
        if len(members) == 1 and not group.done and self.pending[members[0]][0] is group:
            self._show(group)  # the common case: a lone line with nothing of its source before
            return
        stack = [group]
        while stack:
            top = stack[-1]
            if top.done:
                stack.pop()
                continue
            before = next(
                (self.pending[m][0] for m in top.members if self.pending[m][0] is not top), None
            )
            if before is not None:
                stack.append(before)
                continue
            stack.pop()
            self._show(top)

    def _show(self, group: _Group) -> None:
        """Show `group`, first in line for each of its sources, and forget it."""
        group.done = True
        for member in group.members:
            waiting = self.pending[member]
            waiting.popleft()
            if not waiting:
                del self.pending[member]
        if self.open.get(group.key) is group:
            del self.open[group.key]
        if group.late:
            level = self.backoff.pop(group.key, (0, 0.0))[0]
            self.backoff[group.key] = (min(level + 1, BACKOFF_MAX), group.last)
        if len(group.members) == 1:
            self.show(group.members[0], group.text, False)
        else:
            self.show(self.prefix_of(group.members, group.kind), group.text, True)

    def prefix_of(self, members: list[bytes], kind: str = "rank") -> bytes:
        """`[ceon[1-4] r[0-7]] ` for several ranks, `[ceon[1-4]] ` for several nodes,
        `[orchestrator] ceon[1-4]: ` for a note of ours about several nodes."""
        labels = [self._label(m) for m in members]
        hosts = compress_hosts(host for host, _ in labels)
        if kind == "note":
            return ORCHESTRATOR + f"{hosts}: ".encode()
        ranks = [rank for _, rank in labels if rank is not None]
        if not ranks:
            return f"[{hosts}] ".encode()
        return f"[{hosts} {compress_hosts(f'r{rank}' for rank in sorted(ranks))}] ".encode()
