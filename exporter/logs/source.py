"""What a line source other than the file tailer looks like to the pipeline (standard input, the journal).

The file tailer (`logs/tail.py`) has its own richer interface (rotation, truncation statistics); every
other source implements this small protocol:

- `history()` returns the lines that describe the server as it is now (the journal: everything since
  llama-server's last start banner). The pipeline applies them with counting off, exactly like the
  file source's start-up replay, so an exporter restart never re-counts the past.
- `run(on_lines, stop)` feeds every later line, in order, until `stop` is set.

Both read a byte stream (a pipe, journalctl's output) with one loop, `read_lines`: chunks as they
arrive, split into lines at "\n", a chunk's complete lines handed over together, until the input ends
or `stop` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Protocol

#: Bytes asked of a stream per read: what arrived since the last read comes back, up to this.
CHUNK_BYTES = 1 << 16


class LineSource(Protocol):
    """A source of llama-server log lines (one line per call item, without the newline)."""

    @property
    def description(self) -> str:
        """For the landing page and the exporter's own log, e.g. ``journal of llama-server.service``."""
        ...

    @property
    def up(self) -> bool:
        """True while the source is readable (`llamacpp_exporter_source_up{source="log"}`)."""
        ...

    def history(self) -> list[str]:
        """Lines to replay without counting at start (may be empty)."""
        ...

    async def run(self, on_lines: Callable[[list[str]], None], stop: asyncio.Event) -> None:
        """Feed new lines to `on_lines` until `stop` is set (or the source ends for good)."""
        ...


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
