"""The log collectors' exposition of every recorded capture of every build, byte for byte, built through the
production assembly (tests/support/assembly.py) and held to tests/fixtures/golden/<build>/<capture>.prom.

A change of the exposition is reviewed, then recorded: `.venv/bin/python tests/support/log_goldens.py --write`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from log_goldens import CAPTURES, GOLDEN, Capture


@pytest.mark.parametrize("capture", CAPTURES, ids=[c.id for c in CAPTURES])
def test_exposition_matches_golden(capture: Capture, tmp_path: Path) -> None:
    assert capture.exposition(tmp_path) == capture.golden.read_text(encoding="utf-8")


def test_every_golden_file_has_its_capture() -> None:
    """No golden file left behind by a capture that was renamed or removed."""
    assert sorted(GOLDEN.glob("**/*.prom")) == sorted(c.golden for c in CAPTURES)


def test_the_goldens_hold_every_log_collector_and_every_build() -> None:
    """Each of the four log collectors has families in them, on each build (a collector that stopped
    rendering would otherwise leave the files shorter, and recorded so)."""
    one_family_each = (
        "llamacpp_slots",  # ServerLogCollector
        "llamacpp_kv_pool_demand_tokens",  # KVForecastCollector
        "llamacpp_checkpoint_events_total",  # CheckpointCacheCollector
        "llamacpp_request_tokens",  # RequestSizeCollector
    )
    builds = {c.id.split("/")[0] for c in CAPTURES} - {"router"}
    assert builds == {"b9093", "b10306", "b11434", "llama-cpp-python-0.3.16", "xllamacpp-2026.10.11549"}
    for build in builds:
        text = "".join(c.golden.read_text(encoding="utf-8") for c in CAPTURES if c.id.startswith(build + "/"))
        for name in one_family_each:
            assert f"# TYPE {name} " in text, (build, name)
    routed = (GOLDEN / "router" / "children-loaded.prom").read_text(encoding="utf-8")
    for name in one_family_each:
        samples = re.findall(rf"^{name}(?:_bucket|_count)?{{([^}}]*)}}", routed, re.M)
        assert any('model="alpha"' in s for s in samples) and any('model="beta"' in s for s in samples), name
