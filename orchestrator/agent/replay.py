"""The node's stream as the keeper replays it: every byte the agent wrote, numbered by its
offset, up to KEPT_BYTES (then the oldest whole frames go), so that a controller that connects
late, or again, goes on from where it was (keeper.py; the socket it is served on: relay.py).

Standard library only: this module runs on the nodes (see orchestrator.agent.bootstrap).
"""

from __future__ import annotations

from collections import deque

from orchestrator.agent.protocol import WITH_PAYLOAD, Frame

KEPT_BYTES = 64 << 20  # of the node's stream, for a controller that connects late
TRIM_STEP = 64 << 10  # what is dropped past KEPT_BYTES goes in whole frames of about this
PAYLOAD_KINDS = frozenset(kind.value for kind in WITH_PAYLOAD)


class Stream:
    """The bytes the agent wrote, from offset `base` on, and where each frame begins."""

    def __init__(self) -> None:
        self.kept = bytearray()
        self.base = 0  # the offset of kept[0] in the node's stream
        # Offsets where whole frames begin, one at least TRIM_STEP after the last: where
        # trim may cut (a mark per frame would cost more than tiny frames themselves).
        self.starts: deque[int] = deque()
        self.parsed = 0  # the offset up to which frames were read
        self.payload_left = 0
        self.showing: tuple[str, int] | None = None  # an N or M frame's kind and payload start

    @property
    def end(self) -> int:
        return self.base + len(self.kept)

    def add(self, data: bytes) -> list[tuple[str, bytes]]:
        """Keep `data`; returns the (kind, payload) of the frames it completes that are also
        for this task's own output (N and M)."""
        self.kept += data
        shown: list[tuple[str, bytes]] = []
        while self.parsed < self.end:
            if self.payload_left:
                took = min(self.payload_left, self.end - self.parsed)
                self.parsed += took
                self.payload_left -= took
                if not self.payload_left and self.showing is not None:
                    kind, begins = self.showing
                    shown.append(
                        (kind, bytes(self.kept[begins - self.base : self.parsed - self.base]))
                    )
                    self.showing = None
                continue
            newline = self.kept.find(b"\n", self.parsed - self.base)
            if newline < 0:
                break
            words = bytes(self.kept[self.parsed - self.base : newline]).split()
            if not self.starts or self.parsed - self.starts[-1] >= TRIM_STEP:
                self.starts.append(self.parsed)
            self.parsed = self.base + newline + 1
            kind = words[0].decode(errors="replace") if words else ""
            if kind in PAYLOAD_KINDS and words[-1].isdigit():
                self.payload_left = int(words[-1])
                if kind in (Frame.SCRIPT_OUTPUT.value, Frame.MESSAGE.value):
                    self.showing = (kind, self.parsed)
        self.trim()
        return shown

    def at_frame_end(self) -> bool:
        """Whether what is kept ends with a whole frame (where one of ours may go)."""
        return not self.payload_left and self.parsed == self.end

    def trim(self) -> None:
        """Drop the oldest whole frames while more than KEPT_BYTES are kept."""
        while len(self.starts) > 1 and self.end - self.base > KEPT_BYTES:
            self.starts.popleft()
            cut = self.starts[0] - self.base
            del self.kept[:cut]
            self.base += cut

    def since(self, offset: int) -> tuple[int, int]:
        """Where a controller that has `offset` goes on from, and how many bytes it lost."""
        offset = min(max(0, offset), self.end)
        if offset >= self.base:
            return offset, 0
        return self.base, self.base - offset
