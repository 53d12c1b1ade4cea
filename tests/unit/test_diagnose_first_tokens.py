"""`diagnose`'s first tokens by cache outcome, on a real b11434 log (a tiny sliding-window gemma2 with checkpoints
and the prompt cache off, from tests/real_server/test_latency_e2e.py): the exporter's split, the share of full
re-processing, the model named, and each fix given only where its setting is not already in effect (RULES)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from swa_reprocess import HYBRID_RUN, SWA_RUN, first_tokens_of

from exporter.diagnose import analyze, render_text, to_json
from exporter.diagnose.first_tokens import MemoryKind
from exporter.logs import events as ev
from exporter.logs.parse import parse_line_events
from exporter.model.state import ServerState

REPO = Path(__file__).resolve().parents[2]
LOGS = sorted(
    [p for p in (REPO / "tests" / "fixtures").rglob("*.log") if "proc" not in p.parts]
    + sorted((REPO / "exporter" / "data").glob("*.log")),
)

_PROMPT_EVAL = re.compile(r"prompt eval time = +([\d.]+) ms")


def test_the_split_is_the_exporters_and_the_logs() -> None:
    """Each outcome's count and sum as the exporter's histogram has them, from the printed figures."""
    ft = first_tokens_of()
    st = ServerState()
    for line in SWA_RUN.splitlines():
        for e in parse_line_events(line):
            st.apply(e)
    printed = {"cold": 29.33, "cached": 3.51, "full_reprocess": 5.35}  # tasks 0, 14, 23
    assert [o.cache for o in ft.outcomes] == ["full_reprocess", "cached", "cold"]
    for o in ft.outcomes:
        h = st.latency.ttft[o.cache]
        assert (o.requests, o.seconds) == (h.count, h.sum) == (1, printed[o.cache] / 1000.0)
        assert o.p50_s == o.p95_s == o.max_s == printed[o.cache] / 1000.0
    assert ft.seconds == pytest.approx(sum(printed.values()) / 1000.0)
    assert ft.full_reprocess_share == pytest.approx(5.35 / sum(printed.values()))
    assert (ft.model_memory, ft.swa_cells, ft.full_cells) == ("sliding_window", 256, 4096)
    assert (ft.full_reprocess_lines, ft.checkpoint_limit, ft.prompt_cache_enabled) == (1, 0, False)


def test_the_text_states_the_logs_figures() -> None:
    text = " ".join(render_text(analyze(SWA_RUN.splitlines(keepends=True))).split())
    assert "full_reprocess 1 0.005 0.005 0.005 0.005 cached 1 0.004 0.004 0.004 0.004 cold 1 0.029" in text
    share = 5.35 / (29.33 + 3.51 + 5.35) * 100
    assert f"Of the 0.038 s spent on first tokens, {share:.1f} % was full re-processing (1 of 3 requests)." in text
    assert share == pytest.approx(14.0, abs=0.05)
    assert "its SWA cache holds 256 cells (the full-attention cache 4,096)" in text
    assert "re-processed a whole prompt once (`forcing full prompt re-processing`)" in text
    assert "--swa-full keeps the whole window (4,096 SWA cells instead of 256, more KV memory)" in text
    assert "--ctx-checkpoints N turns context checkpoints on (they are disabled)" in text
    assert "--cache-ram N keeps earlier prompts in host memory (the prompt cache is disabled)" in text


@pytest.mark.parametrize("path", LOGS, ids=[str(p.relative_to(REPO)) for p in LOGS])
def test_every_capture_counts_every_first_token(path: Path) -> None:
    """Over every capture: one first token per `prompt eval time` line, and the largest is the log's largest."""
    lines = path.read_text(errors="replace").splitlines(keepends=True)
    data = json.loads(to_json(analyze(lines, str(path), max_runs=0, max_failures=0)))
    printed = [float(m[1]) for line in lines for m in _PROMPT_EVAL.finditer(line)]
    outcomes = [o for run in data["runs"] for o in (run["first_tokens"] or {"outcomes": []})["outcomes"]]
    assert sum(o["requests"] for o in outcomes) == len(printed)
    assert max((o["max_s"] for o in outcomes), default=None) == (max(printed) / 1000.0 if printed else None)
    for o in outcomes:
        assert o["p50_s"] <= o["p95_s"] <= o["max_s"] <= o["seconds"] + 1e-12


def test_a_recurrent_state_names_a_hybrid_or_recurrent_model() -> None:
    """llama_memory_recurrent's size line, as b11434 wrote it for a tiny Mamba (tests/real_server/test_latency_e2e.py)."""
    line = "llama_memory_recurrent: size =    0.02 MiB (     1 cells,   2 layers,  1 seqs  0 rs_seq), R (f32):    0.00 MiB, S (f32):    0.02 MiB, P (f32):    0.00 MiB"
    assert parse_line_events("0.00.008.203 I " + line)[-1] == ev.RecurrentMemory(1)
    assert MemoryKind(recurrent=True).kind() == "recurrent"
    assert MemoryKind(recurrent=True, attention=True).kind() == "hybrid"
    assert MemoryKind(swa_cells=256).kind() == "sliding_window" and MemoryKind().kind() is None
    # A real hybrid run: its KV cache's size line and its recurrent state's, no SWA cache.
    hybrid = first_tokens_of(HYBRID_RUN)
    assert (hybrid.model_memory, hybrid.swa_cells) == ("hybrid", None)
    assert [(o.cache, o.requests) for o in hybrid.outcomes] == [("full_reprocess", 2), ("cold", 1)]
    assert [o.seconds for o in hybrid.outcomes] == pytest.approx([(5.65 + 5.79) / 1000.0, 6.63 / 1000.0], rel=1e-12)
    assert "re-processed a whole prompt 2 times" in " ".join(hybrid.advice)
    assert "its recurrent state cannot be rolled back" in " ".join(hybrid.advice)
    assert "--swa-full" not in " ".join(hybrid.advice)


def test_the_html_page_has_the_same_table() -> None:
    pytest.importorskip("matplotlib")  # the html extra
    from exporter.diagnose.html import render_html

    page = render_html(analyze(SWA_RUN.splitlines(keepends=True)))
    assert "<h3>First tokens by cache outcome</h3>" in page
    assert "<tr><td>full_reprocess</td><td>1</td><td>0.005</td>" in page
    assert "<tr><td>cold</td><td>1</td><td>0.029</td>" in page
    assert "turns context checkpoints on (they are disabled)" in page


def test_a_long_run_keeps_its_first_tokens_in_bounded_memory() -> None:
    """Exact up to 4,096 distinct times; then every 0.01 ms from 1 s to 2 s (100,000 distinct printed values):
    1,001 kept (4 significant digits), the largest exactly."""
    from exporter.model.request_sizes import FIRST_TOKEN_EXACT, ExactValues, exact_quantile

    v = ExactValues()
    printed = [1000.0 + i / 100 for i in range(100_000)]
    for ms in printed[:FIRST_TOKEN_EXACT]:
        v.first_token("cold", ms)
    assert sorted(v.first_token_ms["cold"]) == printed[:FIRST_TOKEN_EXACT] and not v.first_token_rounded
    for ms in printed[FIRST_TOKEN_EXACT:]:
        v.first_token("cold", ms)
    assert v.first_token_rounded == {"cold"} and sum(v.first_token_ms["cold"].values()) == len(printed)
    kept = sorted(v.first_token_ms["cold"].items())
    assert len(kept) == 1_001 and v.first_token_max_ms["cold"] == printed[-1]
    p95 = exact_quantile(kept, 0.95)
    assert p95 is not None and abs(p95 - printed[94_999]) <= printed[94_999] * 0.0005


def test_the_docs_example_is_this_runs_text() -> None:
    """docs/diagnose.md's example of the section is what `diagnose` prints for the real run above."""
    doc = (REPO / "docs" / "diagnose.md").read_text()
    example = doc.split("## Why a first token was slow")[1].split("```text\n")[1].split("```")[0]
    text = render_text(analyze(SWA_RUN.splitlines(keepends=True)))
    section = text.split("  First tokens by cache outcome")[1].split("\n  Failures")[0]
    assert example == "  First tokens by cache outcome" + section
