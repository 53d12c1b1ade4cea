"""The exporter assembled as `llamacpp-exporter` assembles it, following one log, its live sources off.

The one place the tests (the log goldens, tests/unit/test_exposition_golden.py) and the paired CPU bench
(bench/cpu_paired.py) build the production exporter: when the assembly changes, only this file does.
`assembled()` takes the path of `exporter.serve.start`: the flags parsed by `exporter.config.parse_config`
(`--nvml off --proc off`, no `--server-url`: no live source reads anything), the servers built and their
existing lines replayed by `exporter.build.build_logs` and `exporter.serve.open_servers`, refreshed once by
`exporter.unit.refresh_all` (as at start: a router's children are opened there), and `servers_registry`. Lines then reach the state the way
`exporter.logs.follow` hands them on: each `LogTailer.poll` (one read of at most 128 KiB) to
`LogPipeline.feed`, until the file is read to its end; only the follower's timers are left out, so that
the batches, and with them everything, are the same on every run.

`log_exposition()` is the golden files' scheme: the exporter starts on an empty log (nothing to replay)
and every line of the capture arrives live, so every counter counts the whole capture; a restart's earlier
log comes first and the next start truncates the file, as llama-server's `--log-file` does (an in-process
server's stderr only grows: `truncated_at_start=False`). With `replayed`, the other start: the exporter
comes after the server, replays what the file holds without counting, and scrapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from exporter.build import build_logs, servers_registry
from exporter.config import parse_config
from exporter.logs.file_source import FileSource
from exporter.metrics.servers import ServersCollector
from exporter.serve import open_servers
from exporter.unit import refresh_all
from exporter.web import exposition

#: Families of the exposition that are not the log collectors' (ServerLogCollector, KVForecastCollector,
#: CheckpointCacheCollector, RequestSizeCollector): the process' own (CPU, memory, start time: they vary
#: from run to run), the exporter's health (lines read, replayed, truncations, its version: the version
#: changes with every release), how slot tokens are sourced and the log's verbosity (the live sources'
#: collector), and a router's own families (its children, starts and exits).
NOT_LOG_FAMILIES = re.compile(
    r"(process_|python_|llamacpp_exporter_(?!log_lines_rejected)|llamacpp_router_|llamacpp_slot_tokens_source$"
    r"|llamacpp_log_verbosity$)"
)
#: Live sources off: a scrape reads nothing but the log's state, the same on every host.
LIVE_OFF = ("--nvml", "off", "--proc", "off", "--http", "off")


class Assembly:
    """One running assembly (see the module's docstring): write the log, scrape the registry."""

    def __init__(self, log: Path, argv: Sequence[str]) -> None:
        self.log = log
        self.config = parse_config(["--log-file", str(log), *LIVE_OFF, *argv], env={})
        self._loop = asyncio.new_event_loop()
        self._stack = contextlib.AsyncExitStack()
        logs, _ = build_logs(self.config, str(log))
        self.servers = open_servers(self.config, logs, None, self._stack)
        self.pipelines = [s.pipeline for s in self.servers]
        self.collector = ServersCollector(self.servers)
        self.refresh()
        self.registry = servers_registry(self.collector)

    def write(self, data: bytes, *, truncate: bool = False) -> int:
        """Append `data` to the log (after truncating it, as a server's start does) and follow it to its end;
        the lines read."""
        if truncate:
            self.log.write_bytes(b"")
            self.follow()
        with self.log.open("ab") as f:
            f.write(data)
        return self.follow()

    def follow(self) -> int:
        """Read every log to its end, poll by poll, each poll's lines fed as one batch; the lines read."""
        count = 0
        for pipeline in self.pipelines:
            source = pipeline.source
            assert isinstance(source, FileSource)
            tailer = source.tailer
            while True:
                before = (tailer.stats.bytes, tailer.stats.opens, tailer.stats.rotations, tailer.stats.truncations)
                lines = tailer.read()  # as the follower reads
                if lines:
                    pipeline.feed(lines)
                    count += len(lines)
                after = (tailer.stats.bytes, tailer.stats.opens, tailer.stats.rotations, tailer.stats.truncations)
                if tailer.at_eof or after == before:
                    break
        return count

    def refresh(self) -> None:
        """What precedes every scrape: the live sources (none here) and a router's children opened or closed."""
        self._loop.run_until_complete(refresh_all(self.servers))

    def render(self) -> bytes:
        """The /metrics body, as the web app renders it for a scrape without an Accept header (the text format,
        `exporter.web.exposition`: prometheus_client's `generate_latest`, byte for byte)."""
        encoder, _ = exposition.choose("")
        return encoder(self.registry)

    def scrape(self) -> str:
        """A scrape: `refresh()`, then `render()`."""
        self.refresh()
        return self.render().decode()

    def close(self) -> None:
        self._loop.run_until_complete(self._stack.aclose())
        self._loop.close()


@contextlib.contextmanager
def assembled(log: Path, *argv: str) -> Iterator[Assembly]:
    """The exporter following `log` (which must exist; extra flags in `argv`), closed at the end."""
    assembly = Assembly(log, argv)
    try:
        yield assembly
    finally:
        assembly.close()


def log_families(exposition: str) -> str:
    """The exposition's families written by the log collectors, byte for byte (`NOT_LOG_FAMILIES` left out)."""
    blocks = re.split(r"(?m)^(?=# HELP )", exposition)
    return "".join(b for b in blocks if b and not NOT_LOG_FAMILIES.match(b.split(" ", 3)[2]))


@contextlib.contextmanager
def followed(
    logs: Sequence[bytes], tmp: Path, *, truncated_at_start: bool = True, replayed: bool = False
) -> Iterator[Assembly]:
    """The exporter, started on an empty log in `tmp`, after it followed `logs` (the bytes of one server run
    each, in order) as the server wrote them. `replayed`: the exporter starts after the server instead, on
    the file as the runs left it, and replays it without counting."""
    path = tmp / "llama-server.log"
    path.write_bytes(b"")
    if replayed:
        path.write_bytes(logs[-1] if truncated_at_start else b"".join(logs))
        logs = []
    with assembled(path) as exporter:
        for log in logs:
            exporter.write(log, truncate=truncated_at_start)
        yield exporter


def log_exposition(logs: Sequence[bytes], tmp: Path, *, truncated_at_start: bool = True, replayed: bool = False) -> str:
    """The log collectors' families after the exporter followed `logs` (`followed`)."""
    with followed(logs, tmp, truncated_at_start=truncated_at_start, replayed=replayed) as exporter:
        return log_families(exporter.scrape())
