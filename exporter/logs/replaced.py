"""What size probes saw of the contents that replaced the followed one before a read took them.

A restarted llama-server truncates its log as it starts. Between two reads of the tailer, a probe
(`LogTailer.probe`, one fstat and a few small preads) may see that the file no longer holds what was
read: it shrank, or its first bytes or the bytes before the read offset changed. The content it sees
then is a new run's. If that run is replaced in turn before the next read (a server restarting
again at once), it was never read: its bytes and its truncation are counted from what the probes saw
of it here. Each content is known by the same fingerprints the tailer keeps of what it read: its
first bytes and the bytes before the largest size seen.

What the old server wrote after the last look no size shows. `Growth` estimates it from how fast the
content grew at its last looks (twice that rate, for the time since the last look), when the last looks
saw it still growing (a look `QUIET` after its last growth that saw no more says the writer had
stopped): an estimate, on the high side, counted with the known loss so that no loss goes uncounted.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass

__all__ = ["FINGERPRINT_BYTES", "QUIET", "Growth", "Replacements", "Seen", "pread"]

#: How many bytes at the start of a content and before a known offset tell it from another content.
FINGERPRINT_BYTES = 64
#: Seconds without growth after which a writer is taken to have stopped (llama-server writes its lines in
#: bursts far closer together while it works; one that stops may be exiting).
QUIET = 0.05
#: The shortest span a write rate is measured over: two looks microseconds apart say nothing of a rate.
_RATE_SPAN = 0.005
#: The estimate takes the writer as this much faster than the looks saw: a server's last lines (a crash's
#: message, its exit) come in a burst, and an estimate is to count no less than was lost.
_BURST = 2


def pread(fd: int, size: int, offset: int) -> bytes:
    """`size` bytes of `fd` at `offset`, without moving a shared file position where that is possible."""
    if hasattr(os, "pread"):
        return os.pread(fd, size, offset)  # one system call; a follower makes several per wake-up
    os.lseek(fd, offset, os.SEEK_SET)  # Windows has no pread
    return os.read(fd, size)


@dataclass
class Seen:
    """One content as the looks saw it: its largest size, its first bytes, the bytes before that size."""

    size: int = 0
    head: bytes = b""
    tail: bytes = b""

    def holds(self, fd: int, size: int) -> bool:
        """The file (now `size` bytes) still holds this content: not smaller, both fingerprints unchanged."""
        if size < self.size:
            return False
        if pread(fd, len(self.head), 0) != self.head:
            return False
        return pread(fd, len(self.tail), self.size - len(self.tail)) == self.tail

    def grow(self, fd: int, size: int) -> None:
        """The content, held (`holds`), is now `size` bytes: its fingerprints as they are now. A content known
        by fewer bytes than a fingerprint (seen empty, or nothing read yet) is told from another by more."""
        if len(self.head) < FINGERPRINT_BYTES:
            self.head = pread(fd, min(size, FINGERPRINT_BYTES), 0)
        self.size, self.tail = size, _tail(fd, size)


class Replacements:
    """The contents seen replacing the followed one since its last read, oldest first."""

    def __init__(self) -> None:
        self._seen: list[Seen] = []
        self.found_at: float | None = None  # when a look first found the followed content replaced

    def __bool__(self) -> bool:
        return bool(self._seen)

    def note(self, fd: int, size: int, now: float) -> None:
        """A probe found the followed content replaced and the file `size` bytes long at `now`: the latest
        content seen grows, or (replaced in turn: smaller, or other fingerprints) a new one is remembered."""
        if self.found_at is None:
            self.found_at = now
        last = self._seen[-1] if self._seen else None
        if last is None or not last.holds(fd, size):
            last = Seen()
            self._seen.append(last)
        if size > last.size or not last.head:
            last.grow(fd, size)

    def settle(self, fd: int, size: int) -> tuple[int, int]:
        """At the read that handles the replacement: (contents gone unread, their bytes). Every content
        seen was replaced in turn, except the latest if the file (`size` bytes) still holds it."""
        seen, self._seen, self.found_at = self._seen, [], None
        if seen and seen[-1].holds(fd, size):
            seen.pop()
        return len(seen), sum(s.size for s in seen)


class Growth:
    """The followed content's sizes at its last looks: how much it may have written since the last one."""

    def __init__(self) -> None:
        self._grew: collections.deque[tuple[float, int]] = collections.deque(maxlen=8)  # (when, size)
        self._looked = 0.0  # the last look
        self._size = -1  # the size it saw

    def look(self, now: float, size: int) -> None:
        """A look at `now` saw the content `size` bytes long."""
        if size != self._size:
            self._grew.append((now, size))
            self._size = size
        self._looked = now

    def unseen(self, now: float) -> int:
        """Bytes the content may have held at `now` beyond the last size seen: none when a look came
        `QUIET` after its last growth (the writer had stopped), else `_BURST` times its recent rate for
        the time since the last look."""
        if len(self._grew) < 2 or self._looked - self._grew[-1][0] >= QUIET:
            return 0
        (t0, s0), (t1, s1) = self._grew[0], self._grew[-1]
        rate = (s1 - s0) / max(t1 - t0, _RATE_SPAN)
        return max(0, round(_BURST * rate * (now - self._looked)))


def _tail(fd: int, size: int) -> bytes:
    start = max(0, size - FINGERPRINT_BYTES)
    return pread(fd, size - start, start)
