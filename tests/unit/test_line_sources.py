"""One line-source interface: the file, standard input and the journal are each a `LineSource`, and the
pipeline reads its health and stats the same way from each: the same self-metric series for every source
(a stream's file stats present and zero), the file's stats its tailer's, and each source's reason when down."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

from prometheus_client import CollectorRegistry

from exporter.logs.file_source import FileSource
from exporter.logs.journald import JournaldSource
from exporter.logs.source import LineSource
from exporter.logs.stdin import StdinSource
from exporter.logs.tail import LogTailer
from exporter.metrics.exporter_health import ExporterCollector
from exporter.model.state import ServerState
from exporter.pipeline import LogPipeline

LINE = "srv  update_slots: all slots are idle"


def _series(pipeline: LogPipeline) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(ExporterCollector(pipeline))
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if family.name != "llamacpp_exporter_build"
    }


def test_every_source_is_one_line_source(tmp_path: Path) -> None:
    sources: list[LineSource] = [
        FileSource(LogTailer(tmp_path / "llama-server.log")),
        StdinSource(io.BytesIO()),
        JournaldSource("llama-server.service"),
    ]
    for source in sources:
        assert source.stats.truncations == source.stats.rotations == 0
        assert source.stats.lost_bytes == source.stats.long_lines == 0
    # A server's start rewrites the file (a new format can only begin there), not a stream.
    assert [s.restarts_rewrite for s in sources] == [True, False, False]


def test_the_health_series_are_the_same_for_a_file_and_a_stream(tmp_path: Path) -> None:
    """The same families and series for each source; a stream's file stats are zero, the file's its tailer's."""
    log = tmp_path / "llama-server.log"
    log.write_text(f"{LINE}\n" * 3)
    file = LogPipeline(ServerState(), LogTailer(log))
    file.replay_existing()
    log.write_text(f"{LINE}\n")  # a restart: the file truncated
    source = file.source
    assert isinstance(source, FileSource)
    file.feed(source.tailer.poll())
    stream = LogPipeline(ServerState(), StdinSource(io.BytesIO()))
    stream.replay_existing()
    stream.feed([LINE])
    file_series, stream_series = _series(file), _series(stream)
    assert file_series.keys() == stream_series.keys()
    assert file_series[("llamacpp_exporter_log_truncations_total", ())] == source.tailer.stats.truncations == 1
    for name in ("truncations", "rotations", "lost_bytes", "long_lines"):
        assert stream_series[(f"llamacpp_exporter_log_{name}_total", ())] == 0
    assert file_series[("llamacpp_exporter_source_up", (("source", "log"),))] == 1


async def test_a_source_down_says_why_in_its_own_words(tmp_path: Path) -> None:
    missing = LogPipeline(ServerState(), LogTailer(tmp_path / "missing.log"))
    missing.replay_existing()
    assert not missing.up and missing.problem is not None and "missing.log" in missing.problem
    ended = LogPipeline(ServerState(), StdinSource(io.BytesIO(f"{LINE}\n".encode())))
    assert ended.up and ended.problem is None
    await asyncio.wait_for(ended.run(stop=asyncio.Event()), 60)  # a hang guard: the input ends at once
    assert not ended.up
    assert ended.problem == "standard input: the pipeline stopped following it: the log source ended"
    assert ended.source.error == "standard input cannot be read"
    assert ended.lines == 1
