"""The tests' layout stays what docs/testing.md says: it names every test file, and every test file
lives in the folder of its kind (tests/conftest.py checks, as they run, what each test does)."""

from __future__ import annotations

import re

from paths import REPO

TESTS = REPO / "tests"
KINDS = ("unit", "real_server", "system")
TESTING_MD = REPO / "docs" / "testing.md"


def _test_files() -> set[str]:
    return {p.relative_to(REPO).as_posix() for p in TESTS.rglob("test_*.py") if "fixtures" not in p.parts}


def test_testing_md_names_every_test_file_and_no_other() -> None:
    named = set(re.findall(r"`(tests/[\w/]+/test_\w+\.py)`", TESTING_MD.read_text(encoding="utf-8")))
    files = _test_files()
    assert not files - named, f"docs/testing.md does not name {sorted(files - named)}: add a line for each"
    assert not named - files, f"docs/testing.md names {sorted(named - files)}, which do not exist"


def test_every_test_file_is_in_the_folder_of_its_kind() -> None:
    misplaced = sorted(f for f in _test_files() if f.split("/")[1] not in KINDS or f.count("/") != 2)
    assert not misplaced, f"put these in tests/unit, tests/real_server or tests/system: {misplaced}"


def test_support_holds_no_test() -> None:
    assert not list((TESTS / "support").rglob("test_*.py"))
