"""The recorded captures (`tests/fixtures/<build>/<scenario>/capture.json`) replayed through the real tailer
and pipeline as the exporter follows them, and their ground truth checked against what /metrics would show.

A `--log-file` is truncated by each start, as llama-server does; an in-process server's stderr only grows.
`transform` turns a recorded log's bytes into what another system leaves in the file (see windows_logs).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paths import FIXTURES
from prometheus_client import CollectorRegistry
from prometheus_client.samples import Sample

from exporter.logs.tail import LogTailer
from exporter.metrics.servers import log_collectors
from exporter.model.state import ServerState
from exporter.model.view import ServerView
from exporter.pipeline import LogPipeline

CAPTURES = sorted(p.parent for p in FIXTURES.glob("*/*/capture.json"))
IDS = [f"{p.parent.name}/{p.name}" for p in CAPTURES]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def capture(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "capture.json").read_text())
    return data


def follow(
    folder: Path, tmp: Path, transform: Callable[[bytes], bytes] = bytes, polls: int = 10_000
) -> tuple[ServerState, LogTailer]:
    """The state of an exporter that followed the capture's log as the server wrote it (and its tailer,
    closed); each log read in at most `polls` polls."""
    recorded = capture(folder)
    log = tmp / "llama-server.log"
    log.write_bytes(b"")
    state = ServerState()
    tailer = LogTailer(log)
    pipeline = LogPipeline(state, tailer)
    pipeline.replay_existing()  # the exporter starts before the server: an empty file
    for name in recorded["logs"]:
        data = transform((folder / name).read_bytes())
        if recorded["log_truncated_at_start"]:
            # llama-server opens its --log-file with mode "w": the file is empty before its first line.
            log.write_bytes(b"")
            pipeline.feed(tailer.poll())
            log.write_bytes(data)
        else:
            with log.open("ab") as f:
                f.write(data)
        for _ in range(polls):
            pipeline.feed(tailer.poll())
            if not tailer.has_pending():
                break
    tailer.close()
    return state, tailer


def exported(state: ServerState) -> Samples:
    """The samples /metrics would show for the state (log collectors only)."""
    registry = CollectorRegistry()
    for collector in log_collectors(lambda: ServerView(state)):
        registry.register(collector)
    out: Samples = {}
    for family in registry.collect():
        for s in family.samples:
            assert isinstance(s, Sample)
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def truth_mismatches(folder: Path, m: Samples) -> list[str]:
    """Where the samples differ from the capture's ground truth (empty: they equal it)."""
    recorded = capture(folder)
    truth = recorded["truth"]

    def value(name: str, **labels: str) -> float | None:
        return m.get((name, tuple(sorted(labels.items()))))

    checks: list[tuple[str, object, object]] = [
        ("starts", value("llamacpp_server_starts_total"), truth["starts"]),
        ("kv_retries", value("llamacpp_kv_retries_total"), truth["kv_retries"]),
        ("memory_slot_failures", value("llamacpp_kv_memory_slot_failures_total"), truth["memory_slot_failures"]),
        ("context_exceeded", value("llamacpp_context_exceeded_total"), truth["context_exceeded"]),
        (
            "requests_aborted",
            value("llamacpp_requests_aborted_total", reason="context_exceeded") or 0,
            truth["requests_aborted"],
        ),
        ("pool_capacity", value("llamacpp_kv_pool_capacity_tokens"), truth["pool_capacity"]),
        # Every request's size, once: the histogram counts the release lines and sums their n_tokens.
        ("releases", value("llamacpp_request_tokens_count"), truth["releases"]),
        ("release_tokens", value("llamacpp_request_tokens_sum"), truth["release_tokens"]),
    ]
    if value("llamacpp_checkpoint_lines_visible") == 0:  # the verbosity hides them: no figure rather than a 0
        checks.append(("checkpoints_hidden", value("llamacpp_checkpoint_events_total", event="created"), None))
        checks.append(("checkpoints_created", truth["checkpoints_created"], 0))
    else:
        checks.append(
            (
                "checkpoints_created",
                value("llamacpp_checkpoint_events_total", event="created"),
                truth["checkpoints_created"],
            )
        )
    # Where the build's /slots says what each slot holds (b9276+), the log-derived gauges say the same.
    slots = json.loads((folder / "slots.json").read_text())
    if isinstance(slots, list) and slots and all("n_prompt_tokens" in s for s in slots):
        held = {str(s["id"]): float(s["n_prompt_tokens"]) for s in slots}
        checks.append(("slot_tokens", {k: value("llamacpp_slot_tokens", slot=k) for k in held}, held))
    # A server's own log has no line to reject.
    rejected = {k[1]: v for k, v in m.items() if k[0] == "llamacpp_exporter_log_lines_rejected_total" and v}
    checks.append(("rejected", rejected, {}))
    return [f"{what}: {got!r} != {want!r}" for what, got, want in checks if got != want]
