"""Every recorded build against its ground truth: the exporter's counters and `diagnose` on real logs of many builds.

Each `tests/fixtures/<build>/<scenario>/capture.json` was written by `scripts/record-build.sh` with what
the log's own lines say (plain substring counts, not this project's parser) and what the recorder did
(how often it started the server, the configuration it gave). The logs are fed through the real tailer
and pipeline as the exporter follows them: a `--log-file` is truncated by each start, as llama-server
does; an in-process server's stderr only grows. A build added later is one more folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from paths import FIXTURES, REPO
from prometheus_client import CollectorRegistry
from prometheus_client.samples import Sample

from exporter.diagnose import diagnose_files
from exporter.logs.pipeline import LogPipeline
from exporter.logs.tail import LogTailer
from exporter.metrics.servers import log_collectors
from exporter.model.state import ServerState

CAPTURES = sorted(p.parent for p in FIXTURES.glob("*/*/capture.json"))
IDS = [f"{p.parent.name}/{p.name}" for p in CAPTURES]


def _capture(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "capture.json").read_text())
    return data


def follow(folder: Path, tmp: Path) -> ServerState:
    """The state of an exporter that followed the capture's log as the server wrote it."""
    capture = _capture(folder)
    log = tmp / "llama-server.log"
    log.write_bytes(b"")
    state = ServerState()
    tailer = LogTailer(log)
    pipeline = LogPipeline(state, tailer)
    pipeline.replay_existing()  # the exporter starts before the server: an empty file
    for name in capture["logs"]:
        data = (folder / name).read_bytes()
        if capture["log_truncated_at_start"]:
            # llama-server opens its --log-file with mode "w": the file is empty before its first line.
            log.write_bytes(b"")
            pipeline.feed(tailer.poll())
            log.write_bytes(data)
        else:
            with log.open("ab") as f:
                f.write(data)
        for _ in range(10_000):
            pipeline.feed(tailer.poll())
            if not tailer.has_pending():
                break
    tailer.close()
    return state


def exported(state: ServerState) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples /metrics would show for the state (log collectors only)."""
    registry = CollectorRegistry()
    for collector in log_collectors(lambda: state):
        registry.register(collector)
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in registry.collect():
        for s in family.samples:
            assert isinstance(s, Sample)
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_corpus_covers_five_builds_and_every_scenario() -> None:
    builds = {p.parent.name for p in CAPTURES}
    assert len(builds) >= 5, builds
    for build in builds:
        scenarios = {p.name for p in CAPTURES if p.parent.name == build}
        assert {
            "pool-overflow-default",
            "pool-overflow-lv4",
            "pool-overflow-verbose",
            "checkpoints",
            "restart-kill9",
        } <= scenarios
        assert scenarios & {"per-slot-pool", "per-slot-streams"}


@pytest.mark.parametrize("folder", CAPTURES, ids=IDS)
def test_the_exporter_counts_what_the_log_says(folder: Path, tmp_path: Path) -> None:
    capture = _capture(folder)
    truth = capture["truth"]
    m = exported(follow(folder, tmp_path))

    def value(name: str, **labels: str) -> float | None:
        return m.get((name, tuple(sorted(labels.items()))))

    assert value("llamacpp_server_starts_total") == truth["starts"]
    assert value("llamacpp_kv_retries_total") == truth["kv_retries"]
    assert value("llamacpp_kv_memory_slot_failures_total") == truth["memory_slot_failures"]
    assert value("llamacpp_context_exceeded_total") == truth["context_exceeded"]
    assert (value("llamacpp_requests_aborted_total", reason="context_exceeded") or 0) == truth["requests_aborted"]
    if value("llamacpp_checkpoint_lines_visible") == 0:  # the verbosity hides them: no figure rather than a 0
        assert value("llamacpp_checkpoint_events_total", event="created") is None
        assert truth["checkpoints_created"] == 0
    else:
        assert value("llamacpp_checkpoint_events_total", event="created") == truth["checkpoints_created"]
    assert value("llamacpp_kv_pool_capacity_tokens") == truth["pool_capacity"]
    # Every request's size, once: the histogram counts the release lines and sums their n_tokens.
    assert value("llamacpp_request_tokens_count") == truth["releases"]
    assert value("llamacpp_request_tokens_sum") == truth["release_tokens"]
    # Where the build's /slots says what each slot holds (b9276+), the log-derived gauges say the same.
    slots = json.loads((folder / "slots.json").read_text())
    if isinstance(slots, list) and slots and all("n_prompt_tokens" in s for s in slots):
        held = {str(s["id"]): float(s["n_prompt_tokens"]) for s in slots}
        assert {k: value("llamacpp_slot_tokens", slot=k) for k in held} == held
    # A server's own log has no line to reject.
    rejected = {k[1]: v for k, v in m.items() if k[0] == "llamacpp_exporter_log_lines_rejected_total" and v}
    assert rejected == {}
    # The clients saw what the log says: one HTTP 500 "Context size has been exceeded" per aborted request.
    assert capture["http_aborted"] == truth["requests_aborted"]


@pytest.mark.parametrize("folder", CAPTURES, ids=IDS)
def test_diagnose_lists_every_aborted_slot(folder: Path) -> None:
    capture = _capture(folder)
    truth = capture["truth"]
    report = diagnose_files([str(folder / name) for name in capture["logs"]])
    assert report.runs_total == truth["starts"], [(r.file, r.first_line, r.started) for r in report.runs]
    failures = [f for run in report.runs for f in run.failures]
    assert [(sorted(s.slot for s in f.slots), f.tokens_sum) for f in failures] == [
        (f["slots"], f["tokens_sum"]) for f in truth["failures"]
    ]
    assert sum(f.aborted_requests for f in failures) == truth["requests_aborted"]


def test_docs_show_the_corpus_as_it_is() -> None:
    """docs/builds.md carries the tables `tests/support/build_corpus.py --table` makes from the captures."""
    from build_corpus_tables import builds_table, support_table

    docs = (REPO / "docs" / "builds.md").read_text()
    assert builds_table() + "\n" + support_table() in docs, (
        "regenerate: .venv/bin/python tests/support/build_corpus.py --docs"
    )
