"""The one read loop of the line sources (`exporter.logs.source.read_lines`): standard input and the journal.

However the bytes arrive (any chunking), the lines are those of splitting the whole input at "\\n", an
over-long line skipped whole; each read's complete lines go over together; the end hands over an
unfinished last line; a stop cancels the read in progress.
"""

from __future__ import annotations

import asyncio
import os
import random

from exporter.logs.source import LineSplitter, read_lines
from exporter.logs.stdin import MAX_LINE_BYTES, StdinSource

MAX = 10
INPUT = b"one\n\ntwo\r\n" + b"x" * 11 + b"\nexactly10!\n" + b"y" * 25 + b"\nlast"
WANT = [b"one", b"", b"two\r", b"exactly10!", b"last"]


def test_any_chunking_gives_the_lines_of_the_whole_input() -> None:
    rng = random.Random(40)
    for _ in range(300):
        cuts = sorted(rng.sample(range(1, len(INPUT)), rng.randint(0, 12)))
        chunks = [INPUT[a:b] for a, b in zip([0, *cuts], [*cuts, len(INPUT)], strict=True)]
        split = LineSplitter(MAX)
        got = [line for chunk in chunks for line in split.feed(chunk)] + split.end()
        assert got == WANT, chunks


def test_an_unfinished_line_is_never_held_past_the_limit() -> None:
    split = LineSplitter(MAX)
    for _ in range(1000):
        assert split.feed(b"z" * 7) == []
    assert split.feed(b"\nnext\n") == [b"next"]  # the over-long line is skipped whole, the next one kept
    assert split.end() == []


def test_each_read_goes_over_as_one_batch_and_the_end_ends() -> None:
    chunks = [b"a\nb\nc", b"", b"ontinued\nd\n", b"tail"]

    async def run() -> tuple[list[list[bytes]], bool]:
        pending = iter([*chunks[:1], chunks[2], chunks[3], b""])
        batches: list[list[bytes]] = []

        async def read() -> bytes:
            return next(pending)

        ended = await read_lines(read, batches.append, asyncio.Event(), max_line=MAX)
        return batches, ended

    batches, ended = asyncio.run(run())
    assert batches == [[b"a", b"b"], [b"continued", b"d"], [b"tail"]] and ended


def test_a_stop_cancels_the_read_in_progress() -> None:
    async def run() -> tuple[bool, bool]:
        stop = asyncio.Event()
        never = asyncio.get_running_loop().create_future()

        async def read() -> bytes:
            return await never  # type: ignore[no-any-return]

        task = asyncio.ensure_future(read_lines(read, lambda lines: None, stop, max_line=MAX))
        await asyncio.sleep(0)
        stop.set()
        return await asyncio.wait_for(task, 60), never.cancelled()  # a hang guard

    ended, cancelled = asyncio.run(run())
    assert not ended and cancelled


def test_standard_input_through_a_pipe_on_the_event_loop_skips_an_over_long_line_whole() -> None:
    """The loop's pipe reader, as the thread reader (tests/unit/test_portable.py): the same lines, in batches."""
    r, w = os.pipe()
    payload = b"first\r\n" + b"x" * (MAX_LINE_BYTES + 10) + b"\nsecond\n" + "caf\u00e9 \xff\n".encode("latin-1")
    payload += b"short\n" * 100

    async def run() -> tuple[list[list[str]], bool]:
        batches: list[list[str]] = []
        with open(r, "rb", buffering=0) as stream:  # noqa: PTH123
            source = StdinSource(stream)
            task = asyncio.ensure_future(source.run(batches.append, asyncio.Event()))
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, _write_all_and_close, w, payload)
            await asyncio.wait_for(task, 30)
            return batches, source.up

    batches, up = asyncio.run(run())
    lines = [line for batch in batches for line in batch]
    assert lines == ["first", "second", "caf\ufffd \ufffd", *["short"] * 100] and not up
    assert len(batches) < 10  # batches of what each read returned, not one call per line


def _write_all_and_close(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]
    os.close(fd)
