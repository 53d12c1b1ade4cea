"""What a log line costs the exporter, stage by stage: CPU µs a line of each step of the hot path.

Reads a log (the bench corpus: `bench/make_corpus.py --out corpus.log --lines 600000`) the way the
exporter catches up on one, and times each step on its own, over the whole file, the best of
`--repeat` rounds (CPU time of this process):

- ``tail``: `LogTailer.read` to the end (reading, decoding, counting the lines; a batch keeps its text);
- ``join``: a batch's pieces (a read's first line, its block of complete lines) joined into the one text
  the scan runs over (timed as reading and joining, less `tail`);
- ``looks``: the look at a batch before its scan (a line that needs unwrapping, `is_plain`; a line with a
  router tag is told by the scan itself);
- ``parse``: the scan and building the events (`parse_joined`: `is_plain` again, the scan, the line
  format worked out per event);
- ``apply``: `ServerState.apply_events` on every batch's events, and the same again without the bounds checks
  (`exporter.model.bounds`) and without the provenance rules (`exporter.model.provenance`): the
  differences are what those checks cost;
- ``feed``: `LogPipeline.feed`, everything after the tail together (the rest is its own glue:
  routing the events, its reports).

    $ .venv/bin/python bench/hot_path_profile.py corpus.log
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.logs import events as ev  # (imports after the sys.path set-up above)
from exporter.logs.batch import LineBatch
from exporter.logs.parse import is_plain, parse_joined
from exporter.logs.tail import LogTailer
from exporter.model.handlers import DISPATCH
from exporter.model.state import ServerState
from exporter.pipeline import LogPipeline


def _batches(path: str) -> list[LineBatch]:
    tailer, out = LogTailer(path), list[LineBatch]()
    while True:
        before = tailer.stats.bytes
        lines = tailer.read()
        if not lines and tailer.stats.bytes == before:
            return out
        out.append(lines)


def _best(step: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        cpu = time.process_time()
        step()
        times.append(time.process_time() - cpu)
    return min(times)


def _parse_all(texts: list[str], batches: list[LineBatch]) -> None:
    for text, lines in zip(texts, batches, strict=True):
        parse_joined(text, lines)  # (the events are dropped, as the pipeline drops them after each batch)


def _apply_all(events: list[list[ev.Event]]) -> None:
    apply_events = ServerState().apply_events
    for batch in events:
        apply_events(batch)


def _without(events: list[list[ev.Event]], part: int, repeat: int) -> float:
    """`apply_events` with one part of every dispatch entry switched off (1: the bounds check, 2: provenance)."""
    saved = dict(DISPATCH)
    try:
        for kind, entry in saved.items():
            DISPATCH[kind] = (entry[0], None, *entry[2:]) if part == 1 else (entry[0], entry[1], False, None, entry[4])
        return _best(lambda: _apply_all(events), repeat)
    finally:
        DISPATCH.update(saved)


def profile(path: str, repeat: int) -> dict[str, float | int]:
    """CPU µs a line of each step (see the module's docstring)."""
    tail = _best(lambda: _batches(path), repeat)
    batches = _batches(path)
    texts = [lines.text for lines in batches]
    events = [parse_joined(text, lines) for text, lines in zip(texts, batches, strict=True)]
    n = sum(map(len, batches))

    def feed() -> None:
        pipeline = LogPipeline(ServerState(), LogTailer(path))
        for lines in batches:
            pipeline.feed(lines)

    seconds = {
        "tail": tail,
        "join": _best(lambda: [lines.text for lines in _batches(path)], repeat) - tail,
        "looks": _best(lambda: [is_plain(t) for t in texts], repeat),
        "parse": _best(lambda: _parse_all(texts, batches), repeat),
        "apply": _best(lambda: _apply_all(events), repeat),
        "apply_without_bounds": _without(events, 1, repeat),
        "apply_without_provenance": _without(events, 2, repeat),
        "feed": _best(feed, repeat),
    }
    out: dict[str, float | int] = {"lines": n, "batches": len(batches), "events": sum(map(len, events))}
    out.update({f"{step}_us": round(s / n * 1e6, 3) for step, s in seconds.items()})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("log", help="log file to read (the bench corpus)")
    ap.add_argument("--repeat", type=int, default=5, help="rounds of each step; the best is reported (default 5)")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # the pipeline's advice about -lv 4 is not for the benchmark
    print(json.dumps(profile(args.log, args.repeat)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
