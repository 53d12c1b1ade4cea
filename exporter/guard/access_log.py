"""The guard's access log: one JSON line per generation request, written off the request path.

A request's line is put on a bounded queue (never waiting: when the queue is full the line is dropped
and counted) and a writer thread appends it to the file. The file is size-bounded: past `max_bytes` it
is renamed to `PATH.1` (replacing the previous one) and a new one started, so the log takes at most
twice `max_bytes` on disk. A line carries no body and no key:

    {"time": "2026-12-03T08:01:02.123Z", "id": "5f3a-42", "client": "orchestrator",
     "route": "/v1/chat/completions", "model": null, "prompt_tokens": 159069, "budget": 4096,
     "slot": 0, "task": 3121, "cells": 159102, "outcome": "failed", "outcomes": ["admitted", "failed"],
     "status": 500, "queue_wait_s": 0.0, "duration_s": 61.2}
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
from collections import Counter
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

#: Lines that may wait for the writer; one more is dropped (and counted).
QUEUE_LINES = 10_000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


class AccessLog:
    """A bounded queue of lines and the thread that writes them to `path` (rotated at `max_bytes`)."""

    def __init__(self, path: str, max_bytes: int = DEFAULT_MAX_BYTES, queue_lines: int = QUEUE_LINES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.written = 0
        self.rotations = 0
        self.dropped: Counter[str] = Counter()  # reason (queue_full, write_error) → lines
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=queue_lines)
        self._file: IO[bytes] | None = None
        self._size = 0
        self._error: str | None = None
        self._open()  # at start: a path that cannot be written is said at once (raises OSError)
        self._thread = threading.Thread(target=self._run, name="guard access log", daemon=True)
        self._thread.start()

    def write(self, line: dict[str, Any]) -> None:
        """Queue one line; never blocks (a full queue drops it, counted)."""
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            self.dropped["queue_full"] += 1

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued, then stop the writer (waits at most `timeout` seconds)."""
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)

    # ---------------------------------------------------------------- the writer thread

    def _open(self) -> None:
        self._file = Path(self.path).open("ab")  # noqa: SIM115 - kept open by the writer thread
        self._size = self._file.tell()

    def _rotate(self) -> None:
        assert self._file is not None
        self._file.close()
        self._file = None
        Path(self.path).replace(self.path + ".1")
        self.rotations += 1
        self._open()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            batch = [item]
            # What else waits is written in the same go (one flush for a burst).
            with contextlib.suppress(queue.Empty):
                while len(batch) < 1000:
                    batch.append(self._queue.get_nowait())
            stop = any(x is None for x in batch)
            self._write([x for x in batch if x is not None])
            if stop:
                if self._file is not None:
                    with contextlib.suppress(OSError):
                        self._file.close()
                return

    def _write(self, lines: list[dict[str, Any]]) -> None:
        for line in lines:
            data = (json.dumps(line, ensure_ascii=True, separators=(", ", ": ")) + "\n").encode()
            try:
                if self._file is None:
                    self._open()
                elif self._size and self._size + len(data) > self.max_bytes:
                    self._rotate()
                assert self._file is not None
                self._file.write(data)
                self._size += len(data)
                self.written += 1
                self._said(None)
            except OSError as exc:
                self.dropped["write_error"] += 1
                self._said(f"{self.path}: {exc.strerror or exc}")
                if self._file is not None:
                    with contextlib.suppress(OSError):
                        self._file.close()
                self._file = None
        if self._file is not None:
            try:
                self._file.flush()
            except OSError as exc:
                self._said(f"{self.path}: {exc.strerror or exc}")

    def _said(self, error: str | None) -> None:
        """One line in the exporter's log when writing fails, or works again."""
        if error == self._error:
            return
        if error is not None:
            log.warning("guard access log: cannot write: %s; lines are dropped (counted) until it can", error)
        else:
            log.info("guard access log: writing again to %s", self.path)
        self._error = error
