"""The status page (`/`) in a real headless Chromium: the demo as a newcomer sees it, and hostile names.

Chromium is driven as tests/real_server/test_diagnose_html.py drives it: `--dump-dom` gives the page as the
browser built it (after any script would have run), `--screenshot` what it shows. During `--demo`: the pool's
fill on the page lies within 1 % of `/metrics` scraped just before and just after the browser loaded it; once
the demo's first run has aborted its 4 requests, the page shows the overflow with each slot's released cells;
both states are saved as screenshots (the overflow's is docs/status-page.png when UPDATE_SCREENSHOT=1). A log
whose model and path carry `<script>` is shown as text: no script element, the title unchanged, the CSP
header present. A real llama-server (b11434, `-c 512 -np 4 -kvu`) through an overflow and a kill -9: the
incident's cells per slot are the release lines', the page says down, then up, and shows the crash.

Driven by the `chromium` binary itself, not selenium: Debian's chromium-driver is not among the tools the
project's scripts unpack.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from exporter_process import ExporterProcess
from llama_harness import LlamaServer, run_concurrent_completions, wait_for
from llama_requests import http_request
from paths import B11434, REPO
from PIL import Image

from exporter.status.page import CSP

BAD = (0xC6, 0x28, 0x28)  # the page's red (light scheme): the 90 % line, the overflow, aborts
SCREENSHOT = REPO / "docs" / "status-page.png"


class DemoExporter(ExporterProcess):
    """`llamacpp-exporter --demo` (no log file of its own)."""

    @property
    def command(self) -> list[str]:
        cmd = super().command
        i = cmd.index("--log-file")
        return [*cmd[:i], *cmd[i + 2 :]]


def _browser(chromium: Path, url: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(chromium), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args, url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "HOME": str(home)},  # Chromium's profile: not the user's
    )


def _dom(chromium: Path, url: str, home: Path) -> str:
    out = _browser(chromium, url, home, "--dump-dom")
    assert out.returncode == 0 and "<html" in out.stdout, out.stderr[-2000:]
    return out.stdout


def _screenshot(chromium: Path, url: str, home: Path, shot: Path) -> Image.Image:
    out = _browser(chromium, url, home, f"--screenshot={shot}", "--window-size=1000,1700")
    assert out.returncode == 0 and shot.exists(), out.stderr[-2000:]
    with Image.open(shot) as img:
        rgb: Image.Image = img.convert("RGB")
    return rgb


def _fill(exporter: ExporterProcess) -> float:
    value = exporter.sample("llamacpp_kv_pool_usage_ratio")
    return value if value is not None else 0.0


def _page_fill(dom: str) -> float:
    m = re.search(r"([\d,]+) of ([\d,]+) cells \(([\d.]+) %\)", dom)
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


def test_the_demo_on_the_page(tmp_path: Path, chromium_bin: Path) -> None:
    exporter = DemoExporter(tmp_path / "unused.log", ["--demo", "--demo-speed", "1"], ready_timeout=30)
    with exporter:
        url = exporter.url + "/"
        # While the pool fills: the page's figure between two scrapes around the browser's load, within 1 %.
        deadline = time.monotonic() + 60
        while _fill(exporter) < 0.2:
            assert time.monotonic() < deadline, "the demo's pool never filled"
            time.sleep(0.2)
        before = _fill(exporter)
        dom = _dom(chromium_bin, url, tmp_path)
        after = _fill(exporter)
        on_page = _page_fill(dom)
        assert min(before, after) - 0.01 <= on_page <= max(before, after) + 0.01, (before, on_page, after)
        assert "<script" not in dom and dom.count("<svg") >= 2  # the pool bar and the history
        filling = _screenshot(chromium_bin, url, tmp_path, tmp_path / "filling.png")
        assert len(filling.getcolors(maxcolors=1 << 20) or []) > 20 and _reds(filling) > 20  # the 90 % line

        # The overflow: once /metrics counts the 4 aborted requests, the page shows them, slot by slot.
        while (exporter.sample("llamacpp_requests_aborted_total", {"reason": "context_exceeded"}) or 0) < 4:
            assert time.monotonic() < deadline, "the demo never overflowed"
            time.sleep(0.2)
        dom = _dom(chromium_bin, url, tmp_path)
        text = html.unescape(re.sub(r"<[^>]+>", "", dom))
        assert "pool overflow: 4 requests aborted" in text
        assert "slots released 0: 8192, 1: 8192, 2: 8193, 3: 8192 (32769 cells, pool 32768)" in text
        assert "largest holder slot 2 (8193 cells)" in text
        assert "4 requests aborted, 32 retries" in text  # the counters since the exporter started
        # The last hour's charts: the ring takes a point every 10 s, so the aborts' bar comes with the next one.
        while _ring(exporter)[-1] < 4:
            assert time.monotonic() < deadline + 20, "the ring never took a point after the overflow"
            time.sleep(0.5)
        dom = _dom(chromium_bin, url, tmp_path)
        assert "<polyline" in dom and 'class="bars"' in dom  # the fill's line, the aborts' bar
        overflow = _screenshot(chromium_bin, url, tmp_path, tmp_path / "overflow.png")
        assert _reds(overflow) > _reds(filling)  # the incident in red
        if os.environ.get("UPDATE_SCREENSHOT"):  # the README's: with a minute of history (its second fill)
            while (exporter.sample("llamacpp_kv_pool_usage_ratio") or 0) < 0.7 or time.monotonic() < deadline - 5:
                assert time.monotonic() < deadline + 120, "the demo never filled its pool again"
                time.sleep(0.2)
            _screenshot(chromium_bin, url, tmp_path, tmp_path / "docs.png")
            shutil.copyfile(tmp_path / "docs.png", SCREENSHOT)
        status, body = http_request(exporter.url + "/api/status")
        assert status == 200 and b'"schema": 1' in body


HOSTILE = "<script>document.title='pwned'</script>\"'><b>"


def test_hostile_names_are_text_and_no_script_runs(tmp_path: Path, chromium_bin: Path) -> None:
    folder = tmp_path / "logs <svg onload=\"document.title='pwned2'\"> 'q"  # a file name has no '/'
    folder.mkdir()
    log = folder / "llama-server.log"
    text = (B11434 / "exhaust-lv4" / "llama-server.log").read_text(encoding="utf-8")
    log.write_text(text.replace("loading model 'models/tiny-llama.gguf'", f"loading model '{HOSTILE}'", 1))
    with ExporterProcess(log, ["--nvml", "off", "--proc", "off", "--http", "off"]) as exporter:
        with urllib.request.urlopen(exporter.url + "/", timeout=10) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Security-Policy"] == CSP  # no script at all, nothing from elsewhere
        assert "script-src 'none'" in CSP and "default-src 'none'" in CSP
        dom = _dom(chromium_bin, exporter.url + "/", tmp_path)
        assert "<script" not in dom and "<b>" not in dom  # shown as text, not made into elements
        assert "<title>llamacpp-exporter</title>" in dom  # no script changed the title
        assert html.escape(HOSTILE, quote=False) in dom  # the model's name, as text
        assert "<svg onload" not in dom and "&lt;svg onload=" in dom  # the log's path, as text


SEED_ARGS = ["-c", "512", "-np", "4", "-kvu", "-lv", "4", "--metrics", "-t", "2"]


def _status(exporter: ExporterProcess) -> dict[str, object]:
    status, body = http_request(exporter.url + "/api/status")
    assert status == 200
    server: dict[str, object] = json.loads(body)["servers"][0]
    return server


@pytest.mark.llama_server
def test_a_real_server_through_an_overflow_and_a_restart(
    llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path, chromium_bin: Path
) -> None:
    """b11434 `-c 512 -np 4 -kvu`: four requests overflow the pool; the page's incident holds the cells of the
    release lines; kill -9 and a restart: the page says down, then up again, and the crash is an incident."""
    log = tmp_path / "llama-server.log"
    server = LlamaServer(llama_server_bin, tiny_llama_model, SEED_ARGS, log_file=log)
    with server, ExporterProcess(log, ["--server-url", server.url, "--nvml", "off"]) as exporter:
        assert _status(exporter)["state"] == "up" and _status(exporter)["state_source"] == "http"
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
        dom = _dom(chromium_bin, exporter.url + "/", tmp_path)
        assert 'class="badge down"' in dom
        server.start()
        wait_for(lambda: _status(exporter)["state"] == "up", timeout=30, what="up again on /api/status")
        wait_for(
            lambda: any(i["kind"] == "crash" for i in _status(exporter)["incidents"]),  # type: ignore[attr-defined]
            timeout=15,
            what="the crash as an incident",
        )
        dom = _dom(chromium_bin, exporter.url + "/", tmp_path)
        text = html.unescape(re.sub(r"<[^>]+>", "", dom))
        assert (
            'class="badge up"' in dom and "crash: cause unknown" in text and "pool overflow: 4 requests aborted" in text
        )
        _screenshot(chromium_bin, exporter.url + "/", tmp_path, tmp_path / "restarted.png")
