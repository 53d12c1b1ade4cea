"""Child process of bench/run.py: the exporter's own code path catching up on a log file.

`LogTailer` reads the file to its end and `LogPipeline.feed` parses every batch (`parse_lines`)
and applies the events to a `ServerState`: what the exporter does with a large existing log (the
start-up replay is the same loop with counting off). Prints one JSON object with the line count,
the loop's wall and CPU seconds and the state's counters.

With `--mtail-terms`, it instead reports what the parser extracts in the terms of bench/llama.mtail
(events by kind, checkpoint MiB sums, the last `stop processing` tokens per slot…), for the check
that the exporter and mtail agree on every shared count.

    $ .venv/bin/python bench/bulk_exporter.py corpus.log
    {"lines": 2000000, "wall_s": 3.1, "cpu_s": 3.0, "kv_retries": 88858, ...}
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.logs import events as ev  # (imports after the sys.path set-up above)
from exporter.logs.parse import parse_lines
from exporter.logs.tail import LogTailer
from exporter.model.state import ServerState
from exporter.pipeline import LogPipeline


def _batches(tailer: LogTailer) -> Iterator[Sequence[str]]:
    """The file's lines, batch by batch (one read each, as the follower reads), to its end."""
    while True:
        before = tailer.stats.bytes
        lines = tailer.read()
        if not lines and tailer.stats.bytes == before:
            return
        yield lines


def catch_up(path: str) -> dict[str, object]:
    """Tail, parse and apply the whole file, as the exporter does; the state's counters."""
    state = ServerState()
    tailer = LogTailer(path)
    pipeline = LogPipeline(state, tailer)
    wall, cpu = time.perf_counter(), time.process_time()
    for lines in _batches(tailer):
        pipeline.feed(lines)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "lines": pipeline.lines,
        "wall_s": wall,
        "cpu_s": cpu,
        "kv_retries": state.kv_retries,
        "memory_slot_failures": state.memory_slot_failures,
        "context_exceeded": state.context_exceeded,
        "checkpoints_created": state.checkpoint_events["created"],
        "checkpoints_restored": state.checkpoint_events["restored"],
        "checkpoints_erased": state.checkpoint_events["evicted"] + state.checkpoint_events["invalidated"],
    }


def mtail_terms(path: str) -> dict[str, object]:
    """What the parser extracts from the file, in the terms of bench/llama.mtail."""
    tailer = LogTailer(path)
    kinds: Counter[str] = Counter()
    mib = {"created": 0.0, "erased": 0.0}
    last_stop: dict[str, int] = {}
    n_slots: int | None = None
    n_ctx_slot: int | None = None
    cache_prompts: int | None = None
    cache_mib: float | None = None
    lines = 0
    for batch in _batches(tailer):
        lines += len(batch)
        for e in parse_lines(batch):
            kinds[type(e).__name__] += 1
            if isinstance(e, ev.CheckpointCreated):
                mib["created"] += e.size_mib
            elif isinstance(e, ev.CheckpointRemoved):
                mib["erased"] += e.size_mib
            elif isinstance(e, ev.SlotReleased):
                last_stop[str(e.slot)] = e.n_tokens
            elif isinstance(e, ev.SlotsInitialized) and e.n_ctx_slot is not None:
                n_slots, n_ctx_slot = e.n_slots, e.n_ctx_slot
            elif isinstance(e, ev.PromptCacheState):
                cache_prompts, cache_mib = e.prompts, e.size_mib
    return {
        "lines": lines,
        "kv_retries": kinds["KVRetry"],
        "memory_slot_failures": kinds["MemorySlotFailure"],
        "context_exceeded": kinds["DecodeFatal"],
        "decode_failed": kinds["DecodeFailed"],
        "checkpoints_created": kinds["CheckpointCreated"],
        "checkpoints_restored": kinds["CheckpointRestored"],
        "checkpoints_erased": kinds["CheckpointRemoved"],
        "checkpoint_mib_created": mib["created"],
        "checkpoint_mib_erased": mib["erased"],
        "last_stop_n_tokens": last_stop,
        "n_slots": n_slots,
        "n_ctx_slot": n_ctx_slot,
        "prompt_cache_prompts": cache_prompts,
        "prompt_cache_mib": cache_mib,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("log", help="log file to catch up on")
    ap.add_argument("--mtail-terms", action="store_true", help="report the parser's output in llama.mtail's terms")
    args = ap.parse_args()
    logging.disable(logging.WARNING)  # the pipeline's advice about -lv 4 is not for the benchmark
    result = mtail_terms(args.log) if args.mtail_terms else catch_up(args.log)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
