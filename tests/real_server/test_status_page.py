"""The status page (`/`) in a real browser: headless Chromium driven by selenium through chromedriver.

The `chrome` fixture (tests/support/browser.py) runs Debian's chromium through Debian's chromedriver, both
unpacked by scripts/unpack-test-tools.sh; nothing is downloaded. The page is read as the browser built it (its
DOM, after any script would have run) and saved as screenshots. During `--demo`: the pool's fill on the page
lies within 1 % of `/metrics` scraped just before the browser loaded it and just after the test read it; once
the demo's first run has aborted its 4 requests, the page shows the overflow with each slot's released cells
and the last hour's charts (SVG, drawn with a size); both states are saved as screenshots (the overflow's is
docs/status-page.png when UPDATE_SCREENSHOT=1). A log whose model name and path carry `<script>`, quotes and
`<svg onload=…>` is shown as text: no such element, no script ran (the variables and the title those would
set are untouched), the CSP header present, and a script put into the page blocked by it, as the browser's
console reports. A real llama-server (b11434, `-c 512 -np 4 -kvu`) with a model whose large vocabulary takes
about a second to load (tests/support/tiny_gguf.py), started after the exporter, through an overflow and a
kill -9 and a restart: `/api/status`, sampled without pause, says down, loading, up at each start, in that
order; the page loaded between two `loading` samples shows the loading badge (a screenshot); the incident's
cells per slot are the release lines'; the page says down after the kill, then up, and shows the crash.
Without `--http`, where the state comes from the log: a kill -9 writes no line, and the page says down from
the process the exporter had found exiting, then up again at the next start.

Client names do not appear among the hostile input: the guard takes only names of letters, digits and
`._-:@/+` (exporter/guard/clients.py), so none can carry markup.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import pytest
from exporter_process import ExporterProcess
from llama_harness import LlamaServer, run_concurrent_completions, wait_for
from llama_requests import free_port, http_request
from paths import B11434, REPO
from PIL import Image
from tiny_gguf import write_slow_vocab_llama

from exporter.status.page import CSP

if TYPE_CHECKING:
    from selenium.webdriver import Chrome

BAD = (0xC6, 0x28, 0x28)  # the page's red (light scheme): the 90 % line, the overflow, aborts
SCREENSHOT = REPO / "docs" / "status-page.png"


class DemoExporter(ExporterProcess):
    """`llamacpp-exporter --demo` (no log file of its own)."""

    @property
    def command(self) -> list[str]:
        cmd = super().command
        i = cmd.index("--log-file")
        return [*cmd[:i], *cmd[i + 2 :]]


class Page(NamedTuple):
    """The page as the browser built it, read at one moment (the page reloads itself every few seconds)."""

    html: str  # the DOM, serialised
    text: str  # its text (textContent)
    title: str
    svgs: list[dict[str, float]]  # each chart's drawn size, and how many line and bar elements it has


READ = """return [document.documentElement.outerHTML, document.body.textContent, document.title,
    Array.from(document.querySelectorAll('svg'), s => ({width: s.getBoundingClientRect().width,
        height: s.getBoundingClientRect().height, lines: s.querySelectorAll('polyline').length,
        bars: s.querySelectorAll('.bars').length}))];"""


def _load(chrome: Chrome, url: str) -> Page:
    """Load `url` (selenium waits for its load event) and read it in one script, so no reload splits the read."""
    chrome.get(url)
    html, text, title, svgs = chrome.execute_script(READ)
    assert "<html" in html, html[:500]
    return Page(html, text, title, svgs)


def _screenshot(chrome: Chrome, shot: Path) -> Image.Image:
    """What the window shows now, saved to `shot`."""
    assert chrome.save_screenshot(str(shot)), shot
    with Image.open(shot) as img:
        rgb: Image.Image = img.convert("RGB")
    assert list(rgb.size) == chrome.execute_script("return [innerWidth, innerHeight]"), rgb.size  # the viewport
    return rgb


def _fill(exporter: ExporterProcess) -> float:
    value = exporter.sample("llamacpp_kv_pool_usage_ratio")
    return value if value is not None else 0.0


def _page_fill(page: Page) -> float:
    m = re.search(r"([\d,]+) of ([\d,]+) cells \(([\d.]+) %\)", page.text)
    assert m, "no pool figure on the page"
    return float(m[3]) / 100


def _ring(exporter: ExporterProcess) -> list[float]:
    """The requests aborted at each point of the ring, from /api/status."""
    status, body = http_request(exporter.url + "/api/status")
    assert status == 200
    return [v or 0.0 for v in json.loads(body)["servers"][0]["history"]["requests_aborted"]]


def _reds(img: Image.Image) -> int:
    colours: list[tuple[int, tuple[int, int, int]]] = img.getcolors(maxcolors=img.width * img.height) or []  # type: ignore[assignment]
    return sum(n for n, c in colours if max(abs(a - b) for a, b in zip(c, BAD, strict=True)) <= 16)


def test_the_demo_on_the_page(tmp_path: Path, chrome: Chrome) -> None:
    exporter = DemoExporter(tmp_path / "unused.log", ["--demo", "--demo-speed", "1"], ready_timeout=30)
    with exporter:
        url = exporter.url + "/"
        # While the pool fills: the page's figure lies between a scrape before the browser's load and one
        # after the test read the page, within 1 %: whatever the page shows was served between the two.
        deadline = time.monotonic() + 60
        while _fill(exporter) < 0.2:
            assert time.monotonic() < deadline, "the demo's pool never filled"
            time.sleep(0.2)
        before = _fill(exporter)
        page = _load(chrome, url)
        after = _fill(exporter)
        on_page = _page_fill(page)
        assert min(before, after) - 0.01 <= on_page <= max(before, after) + 0.01, (before, on_page, after)
        assert page.title == "llamacpp-exporter" and "<script" not in page.html
        assert len(page.svgs) >= 2 and all(s["width"] > 0 and s["height"] > 0 for s in page.svgs), page.svgs
        filling = _screenshot(chrome, tmp_path / "filling.png")
        assert len(filling.getcolors(maxcolors=1 << 20) or []) > 20 and _reds(filling) > 20  # the 90 % line

        # The overflow: once /metrics counts the 4 aborted requests, the page shows them, slot by slot.
        while (exporter.sample("llamacpp_requests_aborted_total", {"reason": "context_exceeded"}) or 0) < 4:
            assert time.monotonic() < deadline, "the demo never overflowed"
            time.sleep(0.2)
        page = _load(chrome, url)
        assert "pool overflow: 4 requests aborted" in page.text
        assert "slots released 0: 8192, 1: 8192, 2: 8193, 3: 8192 (32769 cells, pool 32768)" in page.text
        assert "largest holder slot 2 (8193 cells)" in page.text
        assert "4 requests aborted, 32 retries" in page.text  # the counters since the exporter started
        # The last hour's charts: the ring takes a point every 10 s, so the aborts' bar comes with the next one.
        while _ring(exporter)[-1] < 4:
            assert time.monotonic() < deadline + 20, "the ring never took a point after the overflow"
            time.sleep(0.5)
        page = _load(chrome, url)
        drawn = [s for s in page.svgs if s["width"] > 0 and s["height"] > 0]
        assert any(s["lines"] for s in drawn) and any(s["bars"] for s in drawn), page.svgs  # the fill, the aborts
        overflow = _screenshot(chrome, tmp_path / "overflow.png")
        assert _reds(overflow) > _reds(filling)  # the incident in red
        if os.environ.get("UPDATE_SCREENSHOT"):  # the README's: with a minute of history (its second fill)
            while (exporter.sample("llamacpp_kv_pool_usage_ratio") or 0) < 0.7 or time.monotonic() < deadline - 5:
                assert time.monotonic() < deadline + 120, "the demo never filled its pool again"
                time.sleep(0.2)
            _load(chrome, url)
            _screenshot(chrome, tmp_path / "docs.png")
            shutil.copyfile(tmp_path / "docs.png", SCREENSHOT)
        status, body = http_request(exporter.url + "/api/status")
        assert status == 200 and b'"schema": 1' in body


# Each would set a variable and the title if it ran: the model's name and a folder of the log's path.
HOSTILE = "<script>window.pwned=1;document.title='pwned'</script>\"'><b>"
HOSTILE_PATH = "logs <svg onload=\"window.pwned2=1;document.title='pwned2'\"> 'q"  # a file name has no '/'
# Listens for CSP violations, then puts an inline script into the page: CSP must block it.
INJECT = """document.addEventListener('securitypolicyviolation',
    e => { window.violations = (window.violations || []).concat([e.violatedDirective]); });
const s = document.createElement('script'); s.textContent = 'window.injected = 1'; document.body.appendChild(s);"""


def test_hostile_names_are_text_and_no_script_runs(tmp_path: Path, chrome: Chrome) -> None:
    folder = tmp_path / HOSTILE_PATH
    folder.mkdir()
    log = folder / "llama-server.log"
    text = (B11434 / "exhaust-lv4" / "llama-server.log").read_text(encoding="utf-8")
    log.write_text(text.replace("loading model 'models/tiny-llama.gguf'", f"loading model '{HOSTILE}'", 1))
    with ExporterProcess(log, ["--nvml", "off", "--proc", "off", "--http", "off"]) as exporter:
        with urllib.request.urlopen(exporter.url + "/", timeout=10) as resp:  # selenium does not see headers
            assert resp.status == 200
            assert resp.headers["Content-Security-Policy"] == CSP  # no script at all, nothing from elsewhere
        assert "script-src 'none'" in CSP and "default-src 'none'" in CSP
        page = _load(chrome, exporter.url + "/")
        # Shown as text, not made into elements: no script, no <b>, nothing with an onload attribute.
        found = chrome.execute_script(
            "return [document.scripts.length, document.querySelectorAll('b, [onload]').length,"
            " typeof window.pwned, typeof window.pwned2]"
        )
        assert found == [0, 0, "undefined", "undefined"]  # and neither script ran
        assert page.title == "llamacpp-exporter"  # unchanged by any script
        assert HOSTILE in page.text and HOSTILE_PATH in page.text  # the model's name and the path, as text
        _screenshot(chrome, tmp_path / "hostile.png")
        # The browser enforces the header: a script put into the page is refused, and its console says why.
        chrome.execute_script(INJECT)
        wait_for(lambda: chrome.execute_script("return window.violations"), timeout=10, what="a CSP violation")
        assert chrome.execute_script("return [window.violations, typeof window.injected]") == [
            ["script-src-elem"],
            "undefined",
        ]
        log = chrome.get_log("browser")  # type: ignore[no-untyped-call]  # untyped in selenium
        console = [entry["message"] for entry in log if entry["source"] == "security"]
        assert any("violates the following Content Security Policy directive 'script-src 'none''" in m for m in console)


SEED_ARGS = ["-c", "512", "-np", "4", "-kvu", "-lv", "4", "--metrics", "-t", "2"]


def _status(exporter: ExporterProcess) -> dict[str, object]:
    status, body = http_request(exporter.url + "/api/status")
    assert status == 200
    server: dict[str, object] = json.loads(body)["servers"][0]
    return server


class Start(NamedTuple):
    """A server's start as `/api/status` said it, and what the browser showed while it said `loading`."""

    states: list[str]  # each state sampled, once per run of equal samples, up to the first `up`
    page: Page | None  # the page loaded between two samples that both said `loading` (None: none was)


def _watch_start(exporter: ExporterProcess, chrome: Chrome, shot: Path | None) -> Start:
    """Sample `/api/status` until it says `up`; at the first `loading`, with `shot`, load the page and save it.
    The states begin with `down`, which the caller saw before it started the server (by the time the server
    is spawned on a busy host it may already be loading, and the first sample says so).

    The page is kept only when the samples just before and just after its load both say `loading`: a start
    goes down, loading, up, never back, so what the browser was served between them said `loading` too.
    """
    states = ["down"]
    page = None
    deadline = time.monotonic() + 60
    while states[-1] != "up":
        assert time.monotonic() < deadline, f"not up within 60 s: {states}"
        state = str(_status(exporter)["state"])
        if state != states[-1]:
            states.append(state)
        if state == "loading" and shot is not None and page is None:
            loaded = _load(chrome, exporter.url + "/")
            if _status(exporter)["state"] == "loading":
                page = loaded
                _screenshot(chrome, shot)
            shot = None  # one try per start: the next sample may already say up
    return Start(states, page)


@pytest.mark.llama_server
def test_a_real_server_through_an_overflow_and_a_restart(
    llama_server_bin: Path, tmp_path: Path, chrome: Chrome
) -> None:
    """b11434 `-c 512 -np 4 -kvu` with a model whose large vocabulary takes about a second to load: the page
    says down before the server starts, loading while it loads, then up; four requests overflow the pool and
    the page's incident holds the cells of the release lines; kill -9 and a restart: down, loading, up again,
    and the crash is an incident."""
    model = write_slow_vocab_llama(tmp_path / "slow-vocab.gguf")
    log = tmp_path / "llama-server.log"
    log.touch()
    port = free_port()
    server = LlamaServer(llama_server_bin, model, SEED_ARGS, log_file=log, port=port, wait_ready=False)
    with ExporterProcess(log, ["--server-url", f"http://127.0.0.1:{port}", "--nvml", "off"]) as exporter:
        assert _status(exporter)["state"] == "down"  # (what `_watch_start`'s states begin with)
        with server:  # spawned, not waited for: the exporter's samples are the wait
            first = _watch_start(exporter, chrome, tmp_path / "loading.png")
            print(f"\nfirst start: {first.states}, page while loading: {first.page is not None}")
            assert first.states == ["down", "loading", "up"], first.states
            assert _status(exporter)["state_source"] == "http"
            results = run_concurrent_completions(server.url, n=4)
            assert [status for status, _ in results] == [500] * 4, results

            def settled() -> bool:
                incidents = _status(exporter)["incidents"]
                assert isinstance(incidents, list)
                return any(i["kind"] == "overflow" and i["aborted"] == 4 and len(i["slots"]) == 4 for i in incidents)

            wait_for(settled, timeout=15, what="the overflow with its 4 slots on /api/status")
            released = {}
            aborted = {m[1] for line in server.log_lines("send_error") if (m := re.search(r"task id = (\d+)", line))}
            for line in server.log_lines("stop processing"):
                m = re.search(r"id\s+(\d+) \| task (\d+) \| stop processing: n_tokens = (\d+)", line)
                if m and m[2] in aborted:
                    released[int(m[1])] = int(m[3])
            incident = next(i for i in _status(exporter)["incidents"] if i["kind"] == "overflow")  # type: ignore[attr-defined]
            assert {s["slot"]: s["cells"] for s in incident["slots"]} == released and len(released) == 4

            server.kill9()
            wait_for(lambda: _status(exporter)["state"] == "down", timeout=15, what="down on /api/status")
            page = _load(chrome, exporter.url + "/")
            assert 'class="badge down"' in page.html
            _screenshot(chrome, tmp_path / "down.png")
            server.start()
            again = _watch_start(exporter, chrome, None if first.page else tmp_path / "loading.png")
            print(f"restart: {again.states}, page while loading: {again.page is not None}")
            assert again.states == ["down", "loading", "up"], again.states
            # The page while loading, from whichever start the browser caught between two `loading` samples.
            loading = first.page or again.page
            assert loading is not None, "the browser never loaded the page while /api/status said loading"
            assert 'class="badge loading"' in loading.html
            wait_for(
                lambda: any(i["kind"] == "crash" for i in _status(exporter)["incidents"]),  # type: ignore[attr-defined]
                timeout=15,
                what="the crash as an incident",
            )
            page = _load(chrome, exporter.url + "/")
            assert 'class="badge up"' in page.html
            assert "crash: cause unknown" in page.text and "pool overflow: 4 requests aborted" in page.text
            _screenshot(chrome, tmp_path / "restarted.png")


def test_without_http_a_killed_server_is_down_from_its_process(
    llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path
) -> None:
    """`--http off`: the state comes from the log, and a kill -9 writes no line. The process the exporter had found
    writing the log is gone and none took its place: `/api/status` says down, from `proc`; the next start is up
    again, from the log."""
    log = tmp_path / "llama-server.log"
    log.touch()
    server = LlamaServer(llama_server_bin, tiny_llama_model, SEED_ARGS, log_file=log)
    with ExporterProcess(log, ["--http", "off", "--nvml", "off"]) as exporter, server:
        wait_for(lambda: _status(exporter)["state"] == "up", timeout=30, what="up from the log")
        wait_for(lambda: _status(exporter)["since"] is not None, timeout=30, what="the server's process found")
        server.kill9()
        wait_for(lambda: _status(exporter)["state"] == "down", timeout=30, what="down after the kill")
        assert _status(exporter)["state_source"] == "proc"
        server.start()
        wait_for(lambda: _status(exporter)["state"] == "up", timeout=30, what="up after the restart")
        assert _status(exporter)["state_source"] == "log"
