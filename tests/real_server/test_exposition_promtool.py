"""`promtool check metrics` on what the exporter exposes (built in process, see support/expositions.py):
a log's collectors mid-fill, a router's children, NVML's GPUs through the fake `pynvml`."""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path

import pytest
from expositions import (
    ROUTER_LINES,
    SERVER_PID,
    SNAPSHOT_AT,
    LogStatus,
    log_registry,
    nvml_live,
    router_exposition,
    state_until,
)
from fake_nvml import GIB, FakeNvml, h200
from prometheus_client import CollectorRegistry, generate_latest

from exporter.logs.tail import LogTailer
from exporter.metrics.exporter_health import ExporterCollector
from exporter.metrics.server_http import ServerHttpCollector
from exporter.model.live import ENDPOINTS, HttpSnapshot
from exporter.model.state import ServerState
from exporter.pipeline import LogPipeline
from exporter.sources.nvml import NvmlReader
from exporter.sources.server_http import REQUESTS_DEFERRED


@pytest.mark.promtool
def test_log_exposition_mid_fill_passes_promtool_silently(promtool_bin: Path) -> None:
    registry = log_registry(state_until("exhaust-long-lv4", 328))
    registry.register(ExporterCollector(LogStatus()))
    text = generate_latest(registry)
    result = subprocess.run([str(promtool_bin), "check", "metrics"], input=text, capture_output=True, timeout=30)
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()
    assert result.stdout.decode().strip() == "" and result.stderr.decode().strip() == ""


@pytest.mark.promtool
def test_router_exposition_labels_each_child_and_passes_promtool(tmp_path: Path, promtool_bin: Path) -> None:
    path = tmp_path / "router.log"
    path.write_text("\n".join(ROUTER_LINES[:SNAPSHOT_AT]) + "\n")
    pipeline = LogPipeline(ServerState(), LogTailer(path))
    pipeline.replay_existing()
    text = router_exposition(pipeline)
    assert 'llamacpp_slot_tokens{model="beta",slot="2"} 50.0' in text
    assert 'llamacpp_requests_aborted_total{model="alpha",reason="context_exceeded"} 0.0' in text  # replayed
    assert re.search(r'llamacpp_server_info\{[^}]*exported_model="[^"]*alpha.gguf",[^}]*model="alpha"', text)
    assert "llamacpp_router_children 2.0" in text
    assert text.count("# TYPE llamacpp_slot_tokens gauge") == 1  # one family, both children's samples
    assert not re.search(r"^llamacpp_slots ", text, re.M)  # the router's own unit has no slot series
    result = subprocess.run([str(promtool_bin), "check", "metrics"], input=text.encode(), capture_output=True)
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()


@pytest.mark.promtool
def test_nvml_exposition_passes_promtool(promtool_bin: Path) -> None:
    fake = FakeNvml([h200(0, 70, [(SERVER_PID, 60 * GIB)]), h200(1, 1)])
    live, reg = nvml_live(NvmlReader(fake))
    asyncio.run(live.refresh())
    text = generate_latest(reg)
    assert b"llamacpp_gpu_memory_free_bytes" in text
    lint = subprocess.run([str(promtool_bin), "check", "metrics"], input=text, capture_output=True, timeout=30)
    assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), lint


@pytest.mark.promtool
def test_http_exposition_with_a_rejected_metrics_value_passes_promtool(promtool_bin: Path) -> None:
    snap = HttpSnapshot(up=True, status=dict.fromkeys(ENDPOINTS, 200), rejected={REQUESTS_DEFERRED: "absent"})
    registry = CollectorRegistry()
    registry.register(ServerHttpCollector(lambda: snap, lambda: {REQUESTS_DEFERRED: 3}))
    text = generate_latest(registry)
    assert (
        b'llamacpp_exporter_http_values_rejected_total{endpoint="/metrics",metric="llamacpp:requests_deferred"} 3.0'
        in text
    )
    lint = subprocess.run([str(promtool_bin), "check", "metrics"], input=text, capture_output=True, timeout=30)
    assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), lint
