"""Where the checkout's parts are, for the tests and their helpers, whichever folder a test is in."""

from __future__ import annotations

from pathlib import Path

#: The repository root.
REPO = Path(__file__).resolve().parents[2]
#: Recorded logs and bodies (tests/fixtures/README.md says what each holds).
FIXTURES = REPO / "tests" / "fixtures"
#: The project's own b11434 captures.
B11434 = FIXTURES / "b11434"
