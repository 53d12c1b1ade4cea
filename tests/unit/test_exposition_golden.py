"""The log collectors' exposition of every recorded capture of every build, byte for byte, built through the
production assembly (tests/support/assembly.py) and held to tests/fixtures/golden/<build>/<capture>.prom: the
exporter started before the server (every line live, counted), and for four captures also after it
(`-replayed`: the file replayed at start without counting).

A change of the exposition is reviewed, then recorded: `.venv/bin/python tests/support/log_goldens.py --write`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from log_goldens import BUILDS, CAPTURES, GOLDEN, Capture
from prometheus_client.parser import text_string_to_metric_families


@pytest.mark.parametrize("capture", CAPTURES, ids=[c.id for c in CAPTURES])
def test_exposition_matches_golden(capture: Capture, tmp_path: Path) -> None:
    assert capture.exposition(tmp_path) == capture.golden.read_text(encoding="utf-8")


def test_every_golden_file_has_its_capture() -> None:
    """No golden file left behind by a capture that was renamed or removed."""
    assert sorted(GOLDEN.glob("**/*.prom")) == sorted(c.golden for c in CAPTURES)


def test_the_goldens_hold_every_log_collector_and_every_build() -> None:
    """Each of the five log collectors has families in them, on each build (a collector that stopped
    rendering would otherwise leave the files shorter, and recorded so)."""
    one_family_each = (
        "llamacpp_slots",  # ServerLogCollector
        "llamacpp_kv_pool_demand_tokens",  # KVForecastCollector
        "llamacpp_checkpoint_events_total",  # CheckpointCacheCollector
        "llamacpp_request_tokens",  # RequestSizeCollector
        "llamacpp_time_to_first_token_seconds",  # LatencyCollector
    )
    # Which builds there are is the fixtures' folders (a lost one: test_every_build_is_understood_from_its_first_line).
    assert len(BUILDS) > 1
    for build in BUILDS:
        text = "".join(c.golden.read_text(encoding="utf-8") for c in CAPTURES if c.id.startswith(build + "/"))
        for name in one_family_each:
            assert f"# TYPE {name} " in text, (build, name)
    routed = (GOLDEN / "router" / "children-loaded.prom").read_text(encoding="utf-8")
    for name in one_family_each:
        samples = re.findall(rf"^{name}(?:_bucket|_count)?{{([^}}]*)}}", routed, re.M)
        assert any('model="alpha"' in s for s in samples) and any('model="beta"' in s for s in samples), name


def _samples(capture: Capture, kinds: set[str]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    families = text_string_to_metric_families(capture.golden.read_text(encoding="utf-8"))
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families if f.type in kinds for s in f.samples}


@pytest.mark.parametrize("replayed", [c for c in CAPTURES if c.replayed], ids=lambda c: c.id)
def test_a_replayed_start_rebuilds_every_gauge_and_counts_nothing(replayed: Capture) -> None:
    """The exporter started after the server shows the gauges of the one that followed it live (the runs
    before a truncating restart are not in the file: they change no gauge of the current run), and no
    past event is counted: every counter and every histogram's count at 0."""
    live = next(c for c in CAPTURES if c.id == replayed.id.removesuffix("-replayed"))
    gauges = _samples(live, {"gauge", "info"})
    assert gauges and _samples(replayed, {"gauge", "info"}) == gauges
    counted = _samples(replayed, {"counter", "histogram"})
    assert counted and not {k: v for k, v in counted.items() if v}
