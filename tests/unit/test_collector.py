"""Collector tests: exposition built from a captured log, a golden file, and promtool's lint."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from paths import FIXTURES
from prometheus_client import CollectorRegistry, generate_latest

from exporter.logs.parse import parse_line
from exporter.metrics.exporter_health import ExporterCollector
from exporter.metrics.forecast import KVForecastCollector
from exporter.metrics.server_log import ServerLogCollector
from exporter.model.state import ServerState


def _state(name: str, *, counting: bool = True) -> ServerState:
    state = ServerState(counting=counting)
    for line in (FIXTURES / "b11434" / name / "llama-server.log").read_text(encoding="utf-8").splitlines():
        event = parse_line(line)
        if event is not None:
            state.apply(event)
    return state


def _registry(state: ServerState) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(ServerLogCollector(lambda: state))
    registry.register(KVForecastCollector(lambda: state))
    return registry


class _LogStatus:
    up = True
    lines = 414
    replayed_lines = 0
    truncations = 1
    rotations = 0
    lost_bytes = 0
    long_lines = 0
    understood = True


@pytest.mark.parametrize("name", ["exhaust-lv4", "recover-purge-lv4", "exhaust-default-verbosity"])
def test_exposition_matches_golden(name: str) -> None:
    """parse → state → exposition, byte for byte; UPDATE_GOLDEN=1 rewrites the files after a reviewed change."""
    text = generate_latest(_registry(_state(name))).decode()
    golden = FIXTURES / "golden" / f"{name}.prom"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


def test_seed_incident_values() -> None:
    reg = _registry(_state("exhaust-lv4"))
    assert reg.get_sample_value("llamacpp_slots") == 4
    assert reg.get_sample_value("llamacpp_kv_pool_capacity_tokens") == 512
    assert reg.get_sample_value("llamacpp_kv_pool_overcommit_ratio") == 4.0
    assert reg.get_sample_value("llamacpp_kv_retries_total") == 26
    assert reg.get_sample_value("llamacpp_context_exceeded_total") == 1
    assert reg.get_sample_value("llamacpp_requests_aborted_total", {"reason": "context_exceeded"}) == 4
    assert reg.get_sample_value("llamacpp_kv_cascades_total", {"outcome": "failed"}) == 1
    assert reg.get_sample_value("llamacpp_kv_cascades_total", {"outcome": "recovered"}) == 0
    assert reg.get_sample_value("llamacpp_slot_tokens", {"slot": "0"}) == 41
    assert reg.get_sample_value("llamacpp_kv_pool_used_tokens") == 41
    assert reg.get_sample_value("llamacpp_kv_pool_usage_ratio") == pytest.approx(41 / 512)
    assert reg.get_sample_value("llamacpp_slot_context_tokens", {"slot": "3"}) == 512
    assert reg.get_sample_value("llamacpp_kv_cache_bytes", {"kind": "k"}) == pytest.approx(0.06 * 2**20)
    info = {
        "build": "b11434",
        "model": "models/tiny-llama.gguf",
        "kv_unified": "true",
        "type_k": "f16",
        "type_v": "f16",
        "capacity_source": "log_kv_cache",
    }
    assert reg.get_sample_value("llamacpp_server_info", info) == 1


def test_nothing_known_yet_still_exposes_counters_at_zero() -> None:
    """Before the first log line: no invented slots or pool, but every counter exists (rate() works)."""
    reg = _registry(ServerState())
    assert reg.get_sample_value("llamacpp_slots") is None
    assert reg.get_sample_value("llamacpp_kv_pool_capacity_tokens") is None
    assert reg.get_sample_value("llamacpp_kv_retries_total") == 0
    assert reg.get_sample_value("llamacpp_requests_aborted_total", {"reason": "context_exceeded"}) == 0


def test_exporter_self_metrics() -> None:
    registry = CollectorRegistry()
    registry.register(ExporterCollector(_LogStatus()))
    assert registry.get_sample_value("llamacpp_exporter_source_up", {"source": "log"}) == 1
    assert registry.get_sample_value("llamacpp_exporter_log_lines_total") == 414
    assert registry.get_sample_value("llamacpp_exporter_log_truncations_total") == 1
    assert registry.get_sample_value("llamacpp_exporter_build_info", {"version": "0.1.0"}) == 1


def _state_until(name: str, last_line: int) -> ServerState:
    state = ServerState()
    lines = (FIXTURES / "b11434" / name / "llama-server.log").read_text(encoding="utf-8").splitlines()
    for line in lines[:last_line]:
        event = parse_line(line)
        if event is not None:
            state.apply(event)
    return state


def test_forecast_mid_fill() -> None:
    """exhaust-long-lv4 after its 21 s `n_gen` lines: four slots generating at their printed tg_3s speeds."""
    reg = _registry(_state_until("exhaust-long-lv4", 328))
    assert reg.get_sample_value("llamacpp_kv_pool_demand_tokens", {"horizon": "prompt"}) == 4 * 339 + 4 * 7244 + 1
    assert reg.get_sample_value("llamacpp_kv_pool_demand_tokens", {"horizon": "max"}) == 4 * 32768
    # No budget known (the log alone): at their limits they need what they hold, not four whole windows.
    used_now = reg.get_sample_value("llamacpp_kv_pool_used_tokens")
    assert reg.get_sample_value("llamacpp_kv_pool_demand_tokens", {"horizon": "limits"}) == used_now
    assert reg.get_sample_value("llamacpp_kv_pool_demand_slots", {"source": "new_prompt"}) == 4
    assert reg.get_sample_value("llamacpp_kv_pool_demand_unknown_budget_slots") == 4
    rate = reg.get_sample_value("llamacpp_kv_pool_fill_rate_tokens_per_second")
    assert rate == pytest.approx(4 * 217.80)
    used = reg.get_sample_value("llamacpp_kv_pool_used_tokens")
    assert used is not None and rate is not None
    assert reg.get_sample_value("llamacpp_kv_pool_full_eta_seconds") == pytest.approx((32768 - used) / rate)
    assert reg.get_sample_value("llamacpp_slot_demand_tokens", {"slot": "0", "horizon": "prompt"}) == 339 + 7244
    # After the abort nothing is in flight: demand 0, no ETA.
    done = _registry(_state("exhaust-long-lv4"))
    assert done.get_sample_value("llamacpp_kv_pool_demand_tokens", {"horizon": "prompt"}) == 0
    assert done.get_sample_value("llamacpp_kv_pool_full_eta_seconds") is None


@pytest.mark.promtool
def test_promtool_check_metrics_is_silent(promtool_bin: Path) -> None:
    registry = _registry(_state_until("exhaust-long-lv4", 328))
    registry.register(ExporterCollector(_LogStatus()))
    text = generate_latest(registry)
    result = subprocess.run([str(promtool_bin), "check", "metrics"], input=text, capture_output=True, timeout=30)
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()
    assert result.stdout.decode().strip() == "" and result.stderr.decode().strip() == ""
