"""Why a first token was slow, on a real llama-server (b11434) with a tiny sliding-window gemma2 and context
checkpoints off: a cold prompt, the same conversation coming back (`cached`), and a prompt that diverges inside
the rolled-over window, which llama-server can only re-process from scratch (`full_reprocess`). Each request's
time to first token is under the outcome its own log lines show, and sums to the log's figures; `diagnose` on
the same log gives the same split (counts and summed seconds), names the sliding-window model and says why."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from llama_harness import ExporterProcess, LlamaServer, http_json, make_prompt, wait_for

pytestmark = pytest.mark.llama_server

# No checkpoints (-ctxcp 0) and no prompt cache: a prompt that diverges past the sliding window is re-processed.
ARGS = ["-c", "4096", "-np", "1", "-ctxcp", "0", "--cache-ram", "0", "-b", "128", "-ub", "128", "-t", "2", "-lv", "4"]
_TASK = re.compile(r"\| task (\d+) \| (.*)$")
REPO = Path(__file__).resolve().parents[2]


def _outcomes(log: str) -> dict[str, list[float]]:
    """Each request's prompt eval seconds by the outcome its task's lines show (docs/metrics.md's rule)."""
    first_cached: dict[int, int] = {}
    said: dict[int, str] = {}
    out: dict[str, list[float]] = {}
    for line in log.splitlines():
        m = _TASK.search(line)
        if m is None:
            continue
        task, text = int(m[1]), m[2]
        if c := re.match(r"cached n_tokens = (\d+)", text):
            first_cached.setdefault(task, int(c[1]))
        elif text.startswith("forcing full prompt re-processing"):
            said[task] = "full_reprocess"
        elif text.startswith("restored context checkpoint"):
            said.setdefault(task, "checkpoint_restored")
        elif t := re.match(r"prompt eval time = +([\d.]+) ms / +(\d+) tokens", text):
            cached = first_cached.get(task)
            outcome = said.get(task) or (
                "unknown" if cached is None else "cached" if 0 < cached >= int(t[2]) else "cold"
            )
            out.setdefault(outcome, []).append(float(t[1]) / 1000.0)
    return out


def test_a_missed_cache_is_labelled_full_reprocess_and_a_returning_conversation_cached(
    llama_server_bin: Path, tiny_gemma2_model: Path, tmp_path: Path
) -> None:
    base = make_prompt(800)  # ~660 tokens: past the SWA cache (256 cells here), its early cells overwritten
    prompts = [base, base + "Another ten", base[:150] + " DIFFERENT " + make_prompt(110)[::-1]]
    with (
        LlamaServer(llama_server_bin, tiny_gemma2_model, ARGS, log_file=tmp_path / "ls.log") as srv,
        ExporterProcess(srv.log_file) as exporter,
    ):
        for prompt in prompts:
            status, body = http_json(
                srv.url + "/completion", body={"prompt": prompt, "n_predict": 8, "cache_prompt": True}, timeout=60
            )
            assert status == 200, body
        wait_for(lambda: srv.log_text().count("total time =") == len(prompts), timeout=15, what="three timings")
        expected = _outcomes(srv.log_text())
        assert {k: len(v) for k, v in expected.items()} == {"cold": 1, "cached": 1, "full_reprocess": 1}

        def counted() -> bool:
            return sum(
                exporter.sample("llamacpp_time_to_first_token_seconds_count", {"cache": k}) or 0 for k in expected
            ) == len(prompts)

        wait_for(counted, timeout=15, what="three first tokens counted")
        for outcome, seconds in expected.items():
            assert exporter.sample("llamacpp_time_to_first_token_seconds_count", {"cache": outcome}) == len(seconds)
            assert exporter.sample("llamacpp_time_to_first_token_seconds_sum", {"cache": outcome}) == pytest.approx(
                sum(seconds), rel=1e-9
            )
        assert exporter.sample("llamacpp_full_reprocess_total") == 1
        reprocessed = re.findall(
            r"forcing full prompt re-processing[\s\S]*?prompt eval time = +[\d.]+ ms / +(\d+)", srv.log_text()
        )
        assert exporter.sample("llamacpp_prompt_reprocessed_tokens_total") == int(reprocessed[0])

        _diagnose_gives_the_same_split(srv.log_file, expected, exporter)


def _diagnose(log: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "exporter", "diagnose", str(log), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr  # no failure in this log
    return done.stdout


def _diagnose_gives_the_same_split(log: Path, expected: dict[str, list[float]], exporter: ExporterProcess) -> None:
    """`diagnose --json` and its text on the same log: the exporter's counts and sums by cache outcome."""
    text = log.read_text()
    (run,) = json.loads(_diagnose(log, "--json"))["runs"]
    ft = run["first_tokens"]
    got = {o["cache"]: o for o in ft["outcomes"]}
    assert list(got) == ["full_reprocess", "cached", "cold"]  # CACHE_OUTCOMES' order
    for outcome, seconds in expected.items():
        o = got[outcome]
        assert o["requests"] == len(seconds)
        assert o["requests"] == exporter.sample("llamacpp_time_to_first_token_seconds_count", {"cache": outcome})
        assert o["seconds"] == pytest.approx(sum(seconds), rel=1e-9)
        assert o["seconds"] == pytest.approx(
            exporter.sample("llamacpp_time_to_first_token_seconds_sum", {"cache": outcome}), rel=1e-9
        )
        assert o["max_s"] == max(seconds) and o["p50_s"] == sorted(seconds)[0]  # one request each
    total = sum(sum(v) for v in expected.values())
    assert ft["seconds"] == pytest.approx(total, rel=1e-9)
    assert ft["full_reprocess_share"] == pytest.approx(sum(expected["full_reprocess"]) / total, rel=1e-9)
    # The model's memory and what the log says of its checkpoints and prompt cache.
    swa = re.search(r"creating +SWA KV cache, size = (\d+) cells", text)
    full = re.search(r"creating non-SWA KV cache, size = (\d+) cells", text)
    assert swa is not None and full is not None
    assert (ft["memory"], ft["swa_cells"], ft["full_cells"]) == ("sliding_window", int(swa[1]), int(full[1]))
    assert ft["full_reprocess_lines"] == text.count("forcing full prompt re-processing") == 1
    assert ft["checkpoints_invalidated"] == text.count("erased invalidated context checkpoint")
    assert "context checkpoints disabled" in text and ft["checkpoint_limit"] == 0
    assert "prompt cache is disabled" in text and ft["prompt_cache_enabled"] is False
    # The text: every figure it states, from the log.
    words = " ".join(_diagnose(log).split())
    for outcome, seconds in expected.items():
        assert f"{outcome} {len(seconds)} {sum(seconds):,.3f}" in words
    share = sum(expected["full_reprocess"]) / total * 100
    assert (
        f"Of the {total:,.3f} s spent on first tokens, {share:.1f} % was full re-processing (1 of 3 requests)." in words
    )
    assert f"its SWA cache holds {int(swa[1]):,} cells (the full-attention cache {int(full[1]):,})" in words
    assert "re-processed a whole prompt once (`forcing full prompt re-processing`)" in words
    assert f"--swa-full keeps the whole window ({int(full[1]):,} SWA cells instead of {int(swa[1]):,}" in words
    assert "--ctx-checkpoints N turns context checkpoints on (they are disabled)" in words
    assert "--cache-ram N keeps earlier prompts in host memory (the prompt cache is disabled)" in words
