"""Every recorded build against its ground truth: the exporter's counters and `diagnose` on real logs of many builds.

Each `tests/fixtures/<build>/<scenario>/capture.json` was written by `scripts/record-build.sh` with what
the log's own lines say (plain substring counts, not this project's parser) and what the recorder did
(how often it started the server, the configuration it gave). The logs are fed through the real tailer
and pipeline as the exporter follows them: a `--log-file` is truncated by each start, as llama-server
does; an in-process server's stderr only grows. A build added later is one more folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from corpus_replay import CAPTURES, IDS, capture, exported, follow, truth_mismatches
from paths import REPO

from exporter.diagnose import diagnose_files


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
    state, _ = follow(folder, tmp_path)
    assert truth_mismatches(folder, exported(state)) == []
    # The clients saw what the log says: one HTTP 500 "Context size has been exceeded" per aborted request.
    recorded = capture(folder)
    assert recorded["http_aborted"] == recorded["truth"]["requests_aborted"]


@pytest.mark.parametrize("folder", CAPTURES, ids=IDS)
def test_diagnose_lists_every_aborted_slot(folder: Path) -> None:
    recorded = capture(folder)
    truth = recorded["truth"]
    report = diagnose_files([str(folder / name) for name in recorded["logs"]])
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
