"""Standard input as the log source: ``llama-server … 2>&1 | llamacpp-exporter --log-file -``.

Also ``journalctl -fu llama-server -o cat -n 0 | llamacpp-exporter --log-file -``. Every line read is
live and counted: a pipe has no past to replay (use ``--log-source journald`` to rebuild gauges from
the journal at start). When the writer closes the pipe the source goes down
(`llamacpp_exporter_source_up{source="log"} 0`) and the exporter keeps serving the last known state.

The stream is read by `read_lines` (`exporter.logs.source`): the lines of each read go to the pipeline
together, as a batch. Its first bytes tell its encoding as a log file's do (`exporter.logs.encoding`):
UTF-8, with or without a byte order mark, or UTF-16 (`type llama-server.stderr | ...` of PowerShell 5.1's
`2>` file), turned into UTF-8 before lines are split; PowerShell's error records are taken off. Where the
event loop cannot wait on the stream (a regular file, /dev/null, or any pipe on Windows' proactor loop),
a thread of its own reads it, from the descriptor itself (`os.read`), never through the buffered
`sys.stdin.buffer`: a daemon thread blocked in a buffered read holds that object's lock, and Python's
shutdown, flushing the standard streams, would then abort ("_enter_buffered_busy").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import stat
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import BinaryIO

from exporter.logs.encoding import PowerShellRecord, Transcoder, sniff
from exporter.logs.source import CHUNK_BYTES, StreamSource, read_lines
from exporter.loops import waits_on_descriptors

log = logging.getLogger(__name__)

#: Longest line accepted; a longer one is skipped whole (llama-server's lines are far shorter).
MAX_LINE_BYTES = 1 << 20
#: Chunks (`CHUNK_BYTES` each at most) a reading thread may be ahead of the pipeline.
_QUEUED_CHUNKS = 16


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


def as_utf8(read: Callable[[], Awaitable[bytes]]) -> Callable[[], Awaitable[bytes]]:
    """`read` (b"": the end of the input) with the stream's encoding told by its first bytes and its
    bytes turned into UTF-8, a byte order mark dropped; b"" still only at the end."""
    head = b""  # the first bytes, while too few to tell the encoding
    transcode: Transcoder | None = None
    decided = ended = False

    async def reading() -> bytes:
        nonlocal head, transcode, decided, ended
        while not ended:
            chunk = await read()
            if not chunk:
                ended = True
                rest, head = head, b""
                if rest:
                    return rest  # too few bytes to tell: as UTF-8; the end comes at the next call
                return transcode(b"") if transcode is not None else b""
            if not decided:
                head += chunk
                encoding = sniff(head)
                if encoding is None:
                    continue
                decided, chunk, head = True, head[encoding.bom :], b""
                if not encoding.is_utf8:
                    transcode = Transcoder(encoding)
            data = transcode(chunk) if transcode is not None else chunk
            if data:
                return data
        return b""

    return reading


class StdinSource(StreamSource):
    """Reads lines from a binary stream (standard input by default); no history to replay."""

    def __init__(self, stream: BinaryIO | None = None) -> None:
        super().__init__()
        self._stream = stream
        self._open = True

    @property
    def description(self) -> str:
        return "standard input"

    @property
    def up(self) -> bool:
        return self._open

    async def run(self, on_lines: Callable[[list[str]], None], stop: asyncio.Event) -> None:
        stream = self._stream
        if stream is None:
            if sys.stdin is None:  # started with standard input closed (`<&-`)
                self._closed()
                return
            stream = sys.stdin.buffer
        loop = asyncio.get_running_loop()
        record: PowerShellRecord | None = PowerShellRecord()  # PowerShell 5.1's error records

        def hand_over(lines: list[bytes]) -> None:
            nonlocal record
            text = [_decode(raw) for raw in lines]
            if record is not None:
                text = record.feed(text)
                if record.done:
                    record = None
            if text:
                on_lines(text)

        if not (_is_pipe(stream) and waits_on_descriptors(loop)):
            # A regular file (`--log-file - < llama-server.log`), /dev/null (systemd's StandardInput=null,
            # `docker run` without -i), or a loop that cannot wait on a pipe (Windows' proactor loop and an
            # anonymous pipe or the console): read in a thread of its own.
            read = as_utf8(self._reading_thread(stream, loop))
            ended = await read_lines(read, hand_over, stop, max_line=MAX_LINE_BYTES)
        else:
            reader = asyncio.StreamReader()
            transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), stream)
            try:
                read = as_utf8(lambda: reader.read(CHUNK_BYTES))
                ended = await read_lines(read, hand_over, stop, max_line=MAX_LINE_BYTES)
            finally:
                transport.close()
        if ended:
            if record is not None and (held := record.flush()):
                on_lines(held)
            self._closed()

    @staticmethod
    def _reading_thread(stream: BinaryIO, loop: asyncio.AbstractEventLoop) -> Callable[[], Awaitable[bytes]]:
        """Start a daemon thread that reads `stream`; returns how to get its next chunk (b"" at the end).

        A read of a pipe cannot be interrupted: at a stop the thread is left blocked in it, and ends with
        the process. Chunks are handed over through a bounded queue: the thread waits while it is full.
        """
        chunks: asyncio.Queue[bytes] = asyncio.Queue(maxsize=_QUEUED_CHUNKS)
        # What one read returns as soon as anything arrived: the descriptor's os.read (see the module's
        # docstring); without one (an in-memory stream), a buffered stream's read1 (its read(n) waits for n
        # bytes), or an unbuffered one's read.
        read_some: Callable[[int], bytes] = getattr(stream, "read1", stream.read)
        with contextlib.suppress(OSError, ValueError, AttributeError):
            fd = stream.fileno()
            read_some = functools.partial(os.read, fd)

        def hand_over(chunk: bytes) -> bool:
            put = chunks.put(chunk)
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
                    chunk = read_some(CHUNK_BYTES)
                    if not hand_over(chunk) or not chunk:  # (b"": the end, handed over too)
                        return
            except (OSError, ValueError) as exc:  # a read error, or the stream closed under the thread
                log.warning("cannot read standard input: %s", exc)
                hand_over(b"")

        threading.Thread(target=read, name="standard input", daemon=True).start()
        return chunks.get

    def _closed(self) -> None:
        self._open = False
        log.warning("standard input closed; serving the last known state")
