"""`diagnose --html FILE`: a self-contained page with charts, opened in a real headless Chromium.

The history is real b11434 output (the captures): a run whose pool overflowed, a run cut mid-request
(a kill), and a clean run, as three rotated files. The page is checked for what makes it
self-contained (nothing fetched from elsewhere), then rendered by Chromium into a screenshot that
must show the charts: not blank, and with the red of the failure and of the crash in it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from paths import REPO
from PIL import Image
from sudden_overflow import sudden_overflow_lines

FIXTURES = REPO / "tests" / "fixtures" / "b11434"
FAILURE_RED = (0xD6, 0x27, 0x28)  # exporter/diagnose/html.py's colour of failures and crashes


def _capture(name: str) -> bytes:
    return (FIXTURES / name / "llama-server.log").read_bytes()


def _history(tmp_path: Path) -> list[str]:
    crashed = b"".join(_capture("exhaust-long-lv4").splitlines(keepends=True)[:400])  # killed mid-request
    files = {
        "llama-server.log.2": (_capture("exhaust-lv4"), 1_764_000_000),
        "llama-server.log.1": (crashed, 1_764_000_600),
        "llama-server.log": (_capture("recover-purge-lv4"), 1_764_086_400),
    }
    for name, (data, mtime) in files.items():
        (tmp_path / name).write_bytes(data)
        os.utime(tmp_path / name, (mtime, mtime))
    return [str(tmp_path / name) for name in files]


def _diagnose(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter", "diagnose", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
        env=env,
    )


def test_html_page_renders_in_a_real_browser(tmp_path: Path, chromium_bin: Path) -> None:
    page = tmp_path / "post-mortem.html"
    out = _diagnose(*_history(tmp_path), "--html", str(page))
    assert out.returncode == 1, out.stderr  # the first run aborts requests
    assert "How runs ended: 2 clean, 1 died mid-request." in out.stdout  # the text report as without --html
    assert out.stderr.startswith(f"llamacpp-exporter diagnose: wrote {page} (")

    text = page.read_text()
    # Self-contained: no script, no stylesheet or image or font fetched from anywhere.
    # (SVG's own references, `url(#clip)` and `href="#glyph"`, point inside the page.)
    assert "<script" not in text and "@import" not in text and not re.search(r"url\((?!#)", text)
    assert not re.search(r"""(?:src|href)\s*=\s*["'](?!#)""", text), "the page refers to something outside it"
    assert text.count("<svg") == 4  # the history, and one chart per run
    assert "crashed or was killed mid-request" in text

    shot = tmp_path / "shot.png"
    browser = subprocess.run(
        [
            str(chromium_bin),
            "--headless",
            "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={shot}",
            "--window-size=1200,2400",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "HOME": str(tmp_path)},  # Chromium's profile: not the user's
    )
    assert browser.returncode == 0 and shot.exists(), browser.stderr[-2000:]
    with Image.open(shot) as img:
        rgb = img.convert("RGB")
        width, height = rgb.size
        colours = rgb.getcolors(maxcolors=width * height)
    assert colours is not None
    counts = {c: n for n, c in colours}
    pixels = width * height
    white = counts.get((255, 255, 255), 0)
    assert (width, height) == (1200, 2400)
    assert pixels - white > pixels * 0.05, f"the screenshot is {white / pixels:.1%} white"
    assert len(counts) > 50, "the screenshot has almost no colours: the charts did not render"
    red = sum(n for c, n in counts.items() if all(abs(a - b) <= 12 for a, b in zip(c, FAILURE_RED, strict=True)))
    assert red > 100, "no failure or crash marked in red"


def _screenshot(chromium_bin: Path, page: Path, shot: Path, size: str, home: Path) -> Image.Image:
    browser = subprocess.run(
        [
            str(chromium_bin),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={shot}",
            f"--window-size={size}",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "HOME": str(home)},
    )
    assert browser.returncode == 0 and shot.exists(), browser.stderr[-2000:]
    return Image.open(shot).convert("RGB")


#: matplotlib's first three colours (slots 0-2) drawn at the chart's alpha 0.85 over white.
_SLOT_COLOURS = [
    tuple(round(c * 0.85 + 255 * 0.15) for c in rgb)
    for rgb in ((0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E), (0x2C, 0xA0, 0x2C))
]


def test_sudden_overflow_chart_shows_every_slot_at_the_texts_failure(tmp_path: Path, chromium_bin: Path) -> None:
    """Three slots that overflow together with no progress lines: the chart draws all three at the cells
    of their release lines, above the pool line, at the failure's time in the text (56.8 s)."""
    log = tmp_path / "llama-server.log"
    log.write_text("".join(sudden_overflow_lines()))
    page = tmp_path / "sudden.html"
    out = _diagnose(str(log), "--html", str(page))
    assert out.returncode == 1, out.stderr
    assert "Failure 1 at line 42 (0:00:56.800 after start)" in out.stdout
    data = json.loads(_diagnose(str(log), "--json").stdout)
    series = data["series"]["1"]
    assert series["failures"] == [56.8] and series["x_unit"] == "seconds since the server started"
    at = max(i for i, x in enumerate(series["x"]) if x == 56.8)
    assert [s[at] for s in series["slots"]] == [70_000, 45_000, 16_500]
    shot = Path(os.environ.get("LLAMACPP_DIAGNOSE_SHOT", tmp_path / "sudden.png"))
    with _screenshot(chromium_bin, page, shot, "1200,900", tmp_path) as rgb:
        width, height = rgb.size
        # The right half: the failure at 56.8 of about 60 s, away from the legend (upper left).
        right = rgb.crop((width // 2, 0, width, height))
        colours = {c: n for n, c in right.getcolors(maxcolors=width * height) or []}
    for slot, colour in enumerate(_SLOT_COLOURS):
        near = sum(n for c, n in colours.items() if all(abs(a - b) <= 6 for a, b in zip(c, colour, strict=True)))
        assert near > 200, f"slot {slot} is not drawn ({near} pixels of its colour)"
    red = sum(n for c, n in colours.items() if all(abs(a - b) <= 12 for a, b in zip(c, FAILURE_RED, strict=True)))
    assert red > 100, "no failure marked in red"


def test_html_without_matplotlib_says_how_to_get_it(tmp_path: Path) -> None:
    """The html extra missing: one line that names it and how to add it, before any log is read, and no page."""
    shadow = tmp_path / "shadow"
    (shadow / "matplotlib").mkdir(parents=True)
    (shadow / "matplotlib" / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow), str(REPO)])}
    page = tmp_path / "page.html"
    out = _diagnose(*_history(tmp_path), "--html", str(page), env=env)
    assert out.returncode == 4 and not page.exists()  # the output cannot be made: not "not a log" (3)
    # The exact pip command for this installation (an editable install of this checkout), not a name
    # on a package index the project is not published to.
    assert out.stderr == (
        "llamacpp-exporter diagnose: error: --html needs matplotlib, the html extra: "
        f"{sys.executable} -m pip install -e '{REPO}[html]'\n"
    )


@pytest.mark.parametrize("target", [".", "", "log"])
def test_html_to_a_folder_or_over_a_log_is_refused(tmp_path: Path, target: str) -> None:
    logs = _history(tmp_path)
    out = _diagnose(*logs, "--html", logs[0] if target == "log" else target)
    assert out.returncode == 4 and out.stdout == "" and len(out.stderr.splitlines()) == 1, out.stderr
    assert "not a folder" in out.stderr or "write over it" in out.stderr


def test_html_to_a_folder_that_does_not_exist(tmp_path: Path) -> None:
    out = _diagnose(*_history(tmp_path), "--html", str(tmp_path / "no" / "page.html"))
    assert out.returncode == 4 and out.stdout == ""
    assert out.stderr.startswith("llamacpp-exporter diagnose: error: ") and "cannot write the page" in out.stderr
    assert len(out.stderr.splitlines()) == 1


@pytest.mark.parametrize("runs", [1, 3])
def test_html_page_is_one_file_without_leftovers(tmp_path: Path, runs: int) -> None:
    """Written atomically (a temporary file renamed): only the page is left in its folder."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = _diagnose(*_history(tmp_path)[:runs], "--html", str(out_dir / "page.html"))
    assert out.returncode in (0, 1), out.stderr
    assert [p.name for p in out_dir.iterdir()] == ["page.html"]
