"""The README and docs/: every link resolves inside the repository, the first screen answers what,
install, run and test, and no page tells the history of how the project was made."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), REPO / "alerts" / "runbook.md"])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = "".join(c for c in text if c in " -" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def _links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8")))


def test_slug_matches_githubs_rules() -> None:
    assert _slug("Live sources: what is true right now") == "live-sources-what-is-true-right-now"
    assert _slug("What `make demo` and `make test` do") == "what-make-demo-and-make-test-do"
    assert _slug("Alerts, dashboards, diagnose") == "alerts-dashboards-diagnose"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_resolves_inside_the_repository(page: Path) -> None:
    broken = []
    for link in _links(page):
        if re.match(r"[a-z]+:", link):  # http(s), mailto: outside links are not checked here
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.is_relative_to(REPO) or not target.exists():
            broken.append(f"{link}: no such file in the repository")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{link}: no heading #{anchor} in {target.relative_to(REPO)}")
    assert not broken, broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_development_history(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    history = re.compile(
        r"issue #?\d+|\bsessions? \d+|\bshared/|not committed|spiked|measured in session|\bTODO\b", re.I
    )
    assert not [m.group(0) for m in history.finditer(text)]


def test_readme_first_screen_answers_what_install_run_and_test() -> None:
    """The first 40 lines: what it is, how to install and run it, the two commands."""
    top = "\n".join((REPO / "README.md").read_text(encoding="utf-8").splitlines()[:40])
    assert "Prometheus exporter" in top
    assert "pip install ." in top
    assert "llamacpp-exporter --log-file" in top
    assert "make demo" in top and "make test" in top
    assert "## Contents" in (REPO / "README.md").read_text(encoding="utf-8")


def test_readme_says_what_make_test_fetches_and_how_long_it_takes() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## What `make demo` and `make test` do") :]
    section = section[: section.index("\n## ", 5)]
    for what in ("~/.cache/llamacpp-exporter/tools", "apt-get download", "dpkg -x", "make test-system", "min"):
        assert what in section, what
    assert "TEST_MINUTES" not in section
