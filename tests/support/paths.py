"""Where the checkout's parts are, for the tests and their helpers, whichever folder a test is in."""

from __future__ import annotations

import os
from pathlib import Path

#: The repository root.
REPO = Path(__file__).resolve().parents[2]
#: Recorded logs and bodies (tests/fixtures/README.md says what each holds).
FIXTURES = REPO / "tests" / "fixtures"
#: The project's own b11434 captures.
B11434 = FIXTURES / "b11434"
#: Where scripts/unpack-test-tools.sh unpacks promtool, Prometheus, Alertmanager, mtail, node_exporter,
#: docker-compose and Chromium from Debian's packages (tests/conftest.py and the benchmarks put it first on PATH).
TOOLS_BIN = (
    Path(
        os.environ.get("LLAMACPP_EXPORTER_TOOLS")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llamacpp-exporter" / "tools"
    )
    / "bin"
)
