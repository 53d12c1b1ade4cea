"""Collector tests: figures of the exposition built from a captured log (the byte-for-byte golden files of
every capture: tests/unit/test_exposition_golden.py)."""

from __future__ import annotations

import pytest
from expositions import LogStatus, log_registry, state_until
from paths import FIXTURES
from prometheus_client import CollectorRegistry

from exporter.logs.parse import parse_line
from exporter.metrics.exporter_health import ExporterCollector
from exporter.model.state import ServerState


def _state(name: str, *, counting: bool = True) -> ServerState:
    state = ServerState(counting=counting)
    for line in (FIXTURES / "b11434" / name / "llama-server.log").read_text(encoding="utf-8").splitlines():
        event = parse_line(line)
        if event is not None:
            state.apply(event)
    return state


def test_seed_incident_values() -> None:
    reg = log_registry(_state("exhaust-lv4"))
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
    reg = log_registry(ServerState())
    assert reg.get_sample_value("llamacpp_slots") is None
    assert reg.get_sample_value("llamacpp_kv_pool_capacity_tokens") is None
    assert reg.get_sample_value("llamacpp_kv_retries_total") == 0
    assert reg.get_sample_value("llamacpp_requests_aborted_total", {"reason": "context_exceeded"}) == 0


def test_exporter_self_metrics() -> None:
    registry = CollectorRegistry()
    registry.register(ExporterCollector(LogStatus()))
    assert registry.get_sample_value("llamacpp_exporter_source_up", {"source": "log"}) == 1
    assert registry.get_sample_value("llamacpp_exporter_log_lines_total") == 414
    assert registry.get_sample_value("llamacpp_exporter_log_truncations_total") == 1
    assert registry.get_sample_value("llamacpp_exporter_build_info", {"version": "0.1.0"}) == 1


def test_forecast_mid_fill() -> None:
    """exhaust-long-lv4 after its 21 s `n_gen` lines: four slots generating at their printed tg_3s speeds."""
    reg = log_registry(state_until("exhaust-long-lv4", 328))
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
    done = log_registry(_state("exhaust-long-lv4"))
    assert done.get_sample_value("llamacpp_kv_pool_demand_tokens", {"horizon": "prompt"}) == 0
    assert done.get_sample_value("llamacpp_kv_pool_full_eta_seconds") is None
