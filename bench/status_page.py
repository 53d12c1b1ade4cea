"""CPU a status page (`/`) and its JSON (`/api/status`) cost against a `/metrics` scrape, with the page's ring full.

    $ .venv/bin/python bench/status_page.py                 # the demo's overflow capture, 30 pairs of blocks
    $ .venv/bin/python bench/status_page.py --log PATH      # another log

The exporter is built as `llamacpp-exporter` builds it (tests/support/assembly.py, live sources off) on a log
that ends with the pool overflowed (4 slots, 32,768 cells, the incident and its slots); every unit's ring is
filled with its 360 points first (`StatusSource.sample`, an hour of samples). Then blocks take turns, one
block of each kind at a time (metrics, page, json, metrics, …), each `--renders` renders, timed with
`time.process_time` (CPU time of this process, not wall time):

- metrics: the `/metrics` body, as the web app renders it (`Assembly.render`, the production registry);
- page: the `/` body (`status.document` of the units' views, then `status.page`);
- json: the `/api/status` body (the document, then `json.dumps`).

Each render makes its views anew, as a request does after the scrape before it (the refresh that precedes
both, reading the log and the live sources, is the same for both and left out). Printed: CPU µs a render of
each kind (median over blocks) and the paired ratio page/metrics and json/metrics (each block over the
metrics block of its turn): median, quartiles. The ring's memory per server is printed too.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(REPO / "tests" / "support")]

from assembly import assembled  # noqa: E402  (after the path: the tests' production assembly)

from exporter.status.document import document  # noqa: E402
from exporter.status.history import POINTS, STEP_SECONDS  # noqa: E402
from exporter.status.page import page  # noqa: E402
from exporter.statuses import StatusSource  # noqa: E402

DEFAULT_LOG = REPO / "tests" / "fixtures" / "b11434" / "exhaust-long-lv4" / "llama-server.log"


def _quartiles(values: Sequence[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"median {q[1]:.3f} (quartiles {q[0]:.3f}–{q[2]:.3f}, range {min(values):.3f}–{max(values):.3f})"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", type=Path, default=DEFAULT_LOG, help="the log the exporter follows (default: an overflow)")
    ap.add_argument("--renders", type=int, default=20, help="renders a block (default 20)")
    ap.add_argument("--pairs", type=int, default=30, help="turns of one block of each kind (default 30)")
    ap.add_argument("--json", type=Path, help="also write the figures to this file")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "llama-server.log"
        log.write_bytes(b"")
        with assembled(log) as exporter:
            exporter.write(args.log.read_bytes())
            exporter.refresh()
            clock = [1_764_000_000.0]
            source = StatusSource(exporter.servers, clock=lambda: clock[0])
            for _ in range(POINTS):  # an hour of points: the ring full
                clock[0] += STEP_SECONDS
                source.sample()
            ring = sum(h.nbytes for h in source.histories.values())

            def metrics() -> int:
                return len(exporter.render())

            def status_page() -> int:
                doc = document(source.statuses(), version="bench", time=clock[0])
                for s in exporter.servers:
                    s.scraped()  # the next render makes its views anew, as /metrics does
                return len(page(doc))

            def status_json() -> int:
                doc = document(source.statuses(), version="bench", time=clock[0])
                for s in exporter.servers:
                    s.scraped()
                return len(json.dumps(doc, allow_nan=False))

            kinds: dict[str, Callable[[], int]] = {"metrics": metrics, "page": status_page, "json": status_json}
            sizes = {name: fn() for name, fn in kinds.items()}  # once untimed: first-call costs left out
            assert (
                "pool overflow: 4 requests aborted" in page(document(source.statuses(), version="b", time=clock[0]))
                or args.log != DEFAULT_LOG
            )
            cpu: dict[str, list[float]] = {name: [] for name in kinds}
            for _ in range(args.pairs):
                for name, fn in kinds.items():
                    start = time.process_time()
                    for _ in range(args.renders):
                        fn()
                    cpu[name].append((time.process_time() - start) / args.renders * 1e6)
    out: dict[str, object] = {"renders": args.renders, "pairs": args.pairs, "ring_bytes": ring, "bytes": sizes}
    print(f"{args.log.name}: ring full ({POINTS} points a series), {ring:,} bytes of ring for its server(s)")
    for name in kinds:
        med = statistics.median(cpu[name])
        out[f"{name}_us"] = med
        print(f"  {name:8s} CPU µs a render: median {med:8.1f}   body {sizes[name]:,} bytes")
    for name in ("page", "json"):
        ratios = [a / b for a, b in zip(cpu[name], cpu["metrics"], strict=True)]
        out[f"{name}_over_metrics"] = statistics.median(ratios)
        print(f"  {name}/metrics paired: {_quartiles(ratios)}")
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
