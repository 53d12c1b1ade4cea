"""What a line source looks like to the pipeline: the file tailer (`logs/file_source.py`), standard input,
the journal. One interface, `LineSource`:

- lines: `replay(on_lines)` hands over the lines that describe the server as it is now (a file's existing
  content; the journal: everything since llama-server's last start banner), which the pipeline applies with
  counting off, so an exporter restart never re-counts the past; `run(on_lines, stop)` feeds every later
  line, in order, until `stop` is set; `catch_up()`, before a scrape, has what the source holds now read.
- health: `up`, and `error`, why it is down in one line naming it (`unreadable`: content refused as not a
  text log, binary data).
- stats: `SourceStats`, what a file's rotations and truncations cost (all zero for a source without them);
  `contents`, how many contents it has begun (a file's opens, rotations, truncations), and
  `restarts_rewrite`, whether a server's start begins a new content (llama-server truncates its
  `--log-file` as it starts), so that a new log format can only begin there.

The stream sources (standard input, the journal) share `StreamSource`: no stats, no content boundaries, no
catch-up, and a `history()` as their replay. They read a byte stream (a pipe, journalctl's output) with
one loop, `read_lines`: chunks as they arrive, split into lines at "\n", a chunk's complete lines handed
over together, until the input ends or `stop` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

#: Bytes asked of a stream per read: what arrived since the last read comes back, up to this.
CHUNK_BYTES = 1 << 16


@dataclass
class SourceStats:
    """What following a file cost, for the exporter's health metrics (`llamacpp_exporter_log_*_total`); all
    monotonic, all zero for a source that has no file (standard input, the journal)."""

    truncations: int = 0  # file shrank below our offset, or its first bytes changed (rewritten in place)
    rotations: int = 0  # path now names a different file (inode/device changed, or recreated after delete)
    lost_bytes: int = 0  # bytes lost: seen by a look and never read, or estimated (see `replaced.Growth`)
    long_lines: int = 0  # lines cut at the longest line kept


class LineSource(Protocol):
    """A source of llama-server log lines (one line per list item, without the newline)."""

    #: True when a server's start begins a new content (a file llama-server truncates as it starts): a new
    #: log format can only begin there. False: any start banner may begin one.
    restarts_rewrite: ClassVar[bool]

    @property
    def description(self) -> str:
        """For the landing page and the exporter's own log, e.g. ``journal of llama-server.service``."""
        ...

    @property
    def up(self) -> bool:
        """True while the source is readable (`llamacpp_exporter_source_up{source="log"}`)."""
        ...

    @property
    def error(self) -> str | None:
        """Why the source cannot be read, in one line naming it; None while it can (or nothing is known yet)."""
        ...

    @property
    def unreadable(self) -> str | None:
        """Why its content was refused as not a text log (binary data); None otherwise."""
        ...

    @property
    def stats(self) -> SourceStats:
        """Rotations, truncations, lost bytes, long lines (zero where the source has none)."""
        ...

    @property
    def contents(self) -> int:
        """How many contents the source has begun so far: lines after it changed may begin a new server run."""
        ...

    def replay(self, on_lines: Callable[[Sequence[str]], None]) -> None:
        """Hand over, in batches, the lines to apply without counting at start (maybe none)."""
        ...

    async def run(self, on_lines: Callable[[Sequence[str]], None], stop: asyncio.Event) -> None:
        """Feed new lines to `on_lines` until `stop` is set (or the source ends for good)."""
        ...

    async def catch_up(self) -> None:
        """Before a scrape: have what the source holds now read (returns at once where there is nothing to do)."""
        ...

    def close(self) -> None:
        """Let go of what the source holds open (a file's descriptors)."""
        ...


class StreamSource:
    """What the stream sources (standard input, the journal) share: no file, so no stats, no content boundaries
    and no catch-up; `history()` is their replay, `description`, `up` and `run` their own."""

    restarts_rewrite: ClassVar[bool] = False

    def __init__(self) -> None:
        self._stats = SourceStats()  # stays zero

    @property
    def description(self) -> str:
        raise NotImplementedError

    @property
    def up(self) -> bool:
        raise NotImplementedError

    @property
    def error(self) -> str | None:
        return None if self.up else f"{self.description} cannot be read"

    @property
    def unreadable(self) -> str | None:
        return None

    @property
    def stats(self) -> SourceStats:
        return self._stats

    @property
    def contents(self) -> int:
        return 0

    def history(self) -> list[str]:
        """Lines to replay without counting at start (may be empty)."""
        return []

    def replay(self, on_lines: Callable[[list[str]], None]) -> None:
        on_lines(self.history())

    async def catch_up(self) -> None:
        return None

    def close(self) -> None:
        return None


class LineSplitter:
    """Bytes, as they arrive, into lines without their "\\n"; a line longer than `max_line` bytes is skipped
    whole, and what is held of an unfinished line never passes `max_line` either."""

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self._partial = b""
        self._skipping = False  # inside an over-long line: its bytes are dropped up to its "\n"

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines that `chunk` completes, in order."""
        lines = chunk.split(b"\n")
        rest = lines.pop()  # after the last "\n": the start of the next line (or b"")
        if lines:
            first = self._partial + lines[0]
            if self._skipping or len(first) > self.max_line:
                del lines[0]
            else:
                lines[0] = first
            self._skipping = False
            self._partial = b""
            if any(len(line) > self.max_line for line in lines):
                lines = [line for line in lines if len(line) <= self.max_line]
        if not self._skipping:
            self._partial += rest
            if len(self._partial) > self.max_line:
                self._partial, self._skipping = b"", True
        return lines

    def end(self) -> list[bytes]:
        """At the end of the input: its last line, if it has no "\\n"."""
        last, self._partial = self._partial, b""
        return [last] if last and not self._skipping else []


async def read_lines(
    read: Callable[[], Awaitable[bytes]],
    on_lines: Callable[[list[bytes]], None],
    stop: asyncio.Event,
    *,
    max_line: int,
) -> bool:
    """Read chunks with `read` (b"" at the end of the input) and hand each chunk's complete lines to
    `on_lines` together, until the input ends (True: its last line, if unfinished, handed over) or `stop`
    is set (False: a read in progress is cancelled)."""
    lines = LineSplitter(max_line)
    stop_task = asyncio.ensure_future(stop.wait())
    try:
        while not stop.is_set():
            reading = asyncio.ensure_future(read())
            await asyncio.wait({reading, stop_task}, return_when=asyncio.FIRST_COMPLETED)
            if not reading.done():
                reading.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reading
                return False
            chunk = reading.result()
            complete = lines.feed(chunk) if chunk else lines.end()
            if complete:
                on_lines(complete)
            if not chunk:
                return True
        return False
    finally:
        stop_task.cancel()
