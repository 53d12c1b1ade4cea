"""Standard input as the log source: ``llama-server … 2>&1 | llamacpp-exporter --log-file -``.

Also ``journalctl -fu llama-server -o cat -n 0 | llamacpp-exporter --log-file -``. Every line read is
live and counted: a pipe has no past to replay (use ``--log-source journald`` to rebuild gauges from
the journal at start). When the writer closes the pipe the source goes down
(`llamacpp_exporter_source_up{source="log"} 0`) and the exporter keeps serving the last known state.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import stat
import sys
import threading
from collections.abc import Callable
from typing import BinaryIO

from exporter.loops import waits_on_descriptors

log = logging.getLogger(__name__)

#: Longest line accepted; a longer one is skipped whole (llama-server's lines are far shorter).
MAX_LINE_BYTES = 1 << 20
#: Lines a reading thread may be ahead of the pipeline.
_QUEUED_LINES = 1024


def _is_pipe(stream: BinaryIO) -> bool:
    """A pipe, a socket or a terminal: what the event loop can wait on (a regular file or /dev/null it cannot)."""
    try:
        fd = stream.fileno()
        mode = os.fstat(fd).st_mode
    except (OSError, ValueError):  # no file descriptor (an in-memory stream) or a closed one
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace").rstrip("\r\n")


class StdinSource:
    """Reads lines from a binary stream (standard input by default)."""

    def __init__(self, stream: BinaryIO | None = None) -> None:
        self._stream = stream
        self._open = True

    @property
    def description(self) -> str:
        return "standard input"

    @property
    def up(self) -> bool:
        return self._open

    def history(self) -> list[str]:
        return []

    async def run(self, on_lines: Callable[[list[str]], None], stop: asyncio.Event) -> None:
        stream = self._stream
        if stream is None:
            if sys.stdin is None:  # started with standard input closed (`<&-`)
                self._closed()
                return
            stream = sys.stdin.buffer
        loop = asyncio.get_running_loop()
        if not (_is_pipe(stream) and waits_on_descriptors(loop)):
            # A regular file (`--log-file - < llama-server.log`), /dev/null (systemd's StandardInput=null,
            # `docker run` without -i), or a loop that cannot wait on a pipe (Windows' proactor loop and an
            # anonymous pipe or the console): read in a thread of its own.
            await self._run_thread(stream, on_lines, stop)
            return
        reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), stream)
        try:
            await self._run_reader(reader, on_lines, stop)
        finally:
            transport.close()

    async def _run_reader(
        self, reader: asyncio.StreamReader, on_lines: Callable[[list[str]], None], stop: asyncio.Event
    ) -> None:
        stop_task = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                read = asyncio.ensure_future(reader.readline())
                await asyncio.wait({read, stop_task}, return_when=asyncio.FIRST_COMPLETED)
                if not read.done():
                    read.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await read
                    return
                try:
                    raw = read.result()
                except ValueError:  # a line longer than the limit: skip it, keep going
                    continue
                if not raw:
                    self._closed()
                    return
                on_lines([_decode(raw)])
        finally:
            stop_task.cancel()

    async def _run_thread(self, stream: BinaryIO, on_lines: Callable[[list[str]], None], stop: asyncio.Event) -> None:
        """Lines read by a daemon thread (a read of a pipe cannot be interrupted: the thread is left blocked in it at
        stop, and ends with the process), handed over through a bounded queue: the thread waits while it is full."""
        loop = asyncio.get_running_loop()
        lines: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=_QUEUED_LINES)

        def hand_over(item: bytes | None) -> bool:
            put = lines.put(item)
            try:
                asyncio.run_coroutine_threadsafe(put, loop).result()
            except RuntimeError:  # the loop has stopped: nobody reads on
                put.close()
                return False
            except concurrent.futures.CancelledError:
                return False
            return True

        def read() -> None:
            try:
                while True:
                    raw = stream.readline(MAX_LINE_BYTES + 1)
                    if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                        while raw and not raw.endswith(b"\n"):  # skip the rest of an over-long line
                            raw = stream.readline(MAX_LINE_BYTES + 1)
                        if raw:
                            continue
                    if not hand_over(raw or None) or not raw:
                        return
            except (OSError, ValueError) as exc:  # a read error, or the stream closed under the thread
                log.warning("cannot read standard input: %s", exc)
                hand_over(None)

        threading.Thread(target=read, name="standard input", daemon=True).start()
        stop_task = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                get = asyncio.ensure_future(lines.get())
                await asyncio.wait({get, stop_task}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    return
                raw = get.result()
                if raw is None:
                    self._closed()
                    return
                on_lines([_decode(raw)])
        finally:
            stop_task.cancel()

    def _closed(self) -> None:
        self._open = False
        log.warning("standard input closed; serving the last known state")
