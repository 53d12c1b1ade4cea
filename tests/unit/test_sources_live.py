"""The live sources together: verbosity warnings, and a scrape while every source fails at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from llama_harness import free_port
from paths import B11434
from prometheus_client.parser import text_string_to_metric_families

from exporter.build import build_logs, servers_registry
from exporter.config import parse_config
from exporter.logs.parse import parse_line
from exporter.metrics.servers import ServersCollector
from exporter.model.state import ServerState
from exporter.serve import open_servers
from exporter.sources.live import LiveSources
from exporter.unit import refresh_all
from exporter.web.server import make_app

FIXTURES = B11434


def _state(name: str) -> ServerState:
    st = ServerState()
    for line in (FIXTURES / name / "llama-server.log").read_text().splitlines():
        e = parse_line(line)
        if e is not None:
            st.apply(e)
    return st


def test_low_verbosity_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="exporter.sources.live")
    st = _state("exhaust-default-verbosity")
    live = LiveSources(st)
    for _ in range(3):
        asyncio.run(live.refresh())
    (record,) = caplog.records
    msg = record.getMessage()
    assert record.levelno == logging.WARNING and "verbosity 3 (< 4)" in msg and "-lv 4" in msg
    assert "KV pool size" in msg and "'new prompt'" in msg and "'clearing prompt'" in msg and "checkpoint" in msg
    # Full verbosity: nothing to say.
    caplog.clear()
    asyncio.run(LiveSources(_state("exhaust-lv4")).refresh())
    assert caplog.records == []


async def test_every_source_failing_still_scrapes_fast(tmp_path: Path) -> None:
    """No NVML (real pynvml, no driver), no pid (empty /proc root), server down: 200, log metrics, zeros."""
    log_file = FIXTURES / "exhaust-lv4" / "llama-server.log"
    empty_proc = tmp_path / "proc"
    empty_proc.mkdir()
    config = parse_config(
        [
            "--log-file",
            str(log_file),
            "--proc-root",
            str(empty_proc),
            "--server-url",
            f"http://127.0.0.1:{free_port()}",
            # A scrape that waited for a failing source would take this long: longer than the client waits.
            "--server-timeout",
            "30",
        ],
        {},
    )
    async with contextlib.AsyncExitStack() as stack:  # the production assembly, as `exporter.serve.start` makes it
        logs, description = build_logs(config, config.logs.file)
        servers = open_servers(config, logs, None, stack)
        registry = servers_registry(ServersCollector(servers))
        app = make_app(registry, log_description=description, health=dict, before_scrape=lambda: refresh_all(servers))
        async with TestClient(TestServer(app)) as client:
            resp = await client.get("/metrics", timeout=aiohttp.ClientTimeout(total=20))
            text = await resp.text()
    assert resp.status == 200
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    for source in ("nvml", "proc", "http"):
        assert samples[("llamacpp_exporter_source_up", (("source", source),))] == 0
    assert samples[("llamacpp_exporter_source_up", (("source", "log"),))] == 1
    assert samples[("llamacpp_up", ())] == 0
    assert samples[("llamacpp_kv_pool_capacity_tokens", ())] == 512  # the log metrics are all there
    assert samples[("llamacpp_slots", ())] == 4
