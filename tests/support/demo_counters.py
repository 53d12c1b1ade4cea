"""Run `llamacpp-exporter --demo`, scrape it once when the first recorded log has been read, and compare
its counters with the ones recorded on Linux (tests/fixtures/golden/demo-counters.json).

The demo writes its log with Python's text mode: CRLF on Windows, LF elsewhere. Counted the same, the
exporter reads llama-server's CRLF logs as it reads LF ones. Runs on any system (the portability
workflow runs it on Windows and macOS; tests/real_server/test_demo_counters.py on Linux):

    $ python tests/support/demo_counters.py --expect tests/fixtures/golden/demo-counters.json
    $ python tests/support/demo_counters.py --write tests/fixtures/golden/demo-counters.json
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

FIRST_LOG_LINES = 456  # exporter/data/demo-exhaust-long-lv4.log, the demo's first run
SPEED = "4"  # about 6 s for the first run, then a pause of 1.25 s before the next one truncates the file
# Counters that count the exporter's own work rather than what the log says.
_OWN = ("llamacpp_exporter_scrape", "llamacpp_exporter_source_", "process_", "python_")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def counters(text: str) -> dict[str, float]:
    """Every counter sample of an exposition (`name{labels}` → value), the exporter's own work left out."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.type != "counter" or family.name.startswith(_OWN):
            continue
        for s in family.samples:
            if s.name.endswith("_total"):
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}"] = s.value
    return out


def first_run_counters(timeout: float = 120.0) -> dict[str, float]:
    """Start the demo, scrape until the first run's lines are all read, return the counters then."""
    port = _port()
    with tempfile.TemporaryDirectory() as tmp:
        out = (Path(tmp) / "exporter.out").open("wb")
        cmd = [
            sys.executable,
            "-m",
            "exporter",
            "--demo",
            "--demo-speed",
            SPEED,
            "--listen-address",
            f"127.0.0.1:{port}",
        ]
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    break
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                        found = counters(r.read().decode())
                except OSError:
                    found = {}
                lines = found.get("llamacpp_exporter_log_lines_total{}", 0)
                if lines == FIRST_LOG_LINES:
                    return found
                if lines > FIRST_LOG_LINES:
                    raise RuntimeError(f"the demo's second run began between two scrapes ({lines:g} lines read)")
                time.sleep(0.05)
        finally:
            proc.terminate()
            proc.wait(10)
            out.close()
            output = (Path(tmp) / "exporter.out").read_text(errors="replace")
    raise RuntimeError(f"the demo never read its first run's {FIRST_LOG_LINES} lines; its output:\n{output[-3000:]}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--expect", type=Path, help="compare with the counters in this JSON file")
    ap.add_argument("--write", type=Path, help="write the counters to this JSON file")
    args = ap.parse_args(argv)
    found = first_run_counters()
    if args.write:
        args.write.write_text(json.dumps(found, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if args.expect:
        expected = json.loads(args.expect.read_text(encoding="utf-8"))
        diff = {k: (expected.get(k), found.get(k)) for k in sorted(set(expected) | set(found))}
        diff = {k: v for k, v in diff.items() if v[0] != v[1]}
        for k, (want, got) in diff.items():
            print(f"{k}: expected {want}, got {got}")
        print(f"{len(found)} counters, {len(diff)} differ from {args.expect}")
        return 1 if diff else 0
    print(json.dumps(found, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
