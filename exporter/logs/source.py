"""What a line source other than the file tailer looks like to the pipeline (standard input, the journal).

The file tailer (`logs/tail.py`) has its own richer interface (rotation, truncation statistics); every
other source implements this small protocol:

- `history()` returns the lines that describe the server as it is now (the journal: everything since
  llama-server's last start banner). The pipeline applies them with counting off, exactly like the
  file source's start-up replay, so an exporter restart never re-counts the past.
- `run(on_lines, stop)` feeds every later line, in order, until `stop` is set.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol


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
