"""`llamacpp-exporter --demo` as a process: its counters once the first recorded run is read equal
tests/fixtures/golden/demo-counters.json, the figures the portability workflow compares Windows' and
macOS' demo with (tests/support/demo_counters.py, the same script the workflow runs)."""

from __future__ import annotations

import json

from demo_counters import FIRST_LOG_LINES, first_run_counters
from paths import FIXTURES


def test_the_demo_counts_what_the_golden_file_says() -> None:
    expected = json.loads((FIXTURES / "golden" / "demo-counters.json").read_text(encoding="utf-8"))
    found = first_run_counters()
    assert found == expected, (
        "the demo's counters changed on Linux; if that is intended (a new counter family), record them again: "
        "python tests/support/demo_counters.py --write tests/fixtures/golden/demo-counters.json"
    )
    assert found["llamacpp_exporter_log_lines_total{}"] == FIRST_LOG_LINES
    assert found['llamacpp_requests_aborted_total{reason="context_exceeded"}'] == 4  # the recorded overflow
