"""`promtool check metrics` on every log golden file (tests/fixtures/golden/, written by
tests/support/log_goldens.py): the four log collectors' families of every capture lint clean."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from log_goldens import CAPTURES, Capture


@pytest.mark.promtool
@pytest.mark.parametrize("capture", CAPTURES, ids=[c.id for c in CAPTURES])
def test_golden_exposition_passes_promtool_silently(capture: Capture, promtool_bin: Path) -> None:
    text = capture.golden.read_bytes()
    result = subprocess.run([str(promtool_bin), "check", "metrics"], input=text, capture_output=True, timeout=30)
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()
    assert result.stdout.decode().strip() == "" and result.stderr.decode().strip() == ""
