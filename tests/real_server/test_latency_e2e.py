"""Why a first token was slow, on a real llama-server (b11434) with a tiny sliding-window gemma2 and context
checkpoints off: a cold prompt, the same conversation coming back (`cached`), and a prompt that diverges inside
the rolled-over window, which llama-server can only re-process from scratch (`full_reprocess`). Each request's
time to first token is under the outcome its own log lines show, and sums to the log's figures. Then a
conversation that comes back after its checkpoint was evicted (one checkpoint a slot: re-processed whole; eight:
restored). And a tiny recurrent model (Mamba) that re-processes every prompt not continuing its state. On each
log `diagnose` gives the same split (counts and summed seconds), names the model's memory, and says why and
what helps."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from llama_harness import ExporterProcess, LlamaServer, http_json, make_prompt, wait_for

from exporter.model.latency import CACHE_OUTCOMES

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
        expected = _outcomes(_send(srv, prompts))
        assert {k: len(v) for k, v in expected.items()} == {"cold": 1, "cached": 1, "full_reprocess": 1}, _said(
            srv.log_text()
        )

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

        ft, words = _diagnose_gives_the_same_split(srv.log_file, expected, exporter)
    # The model's memory and what the log says of its checkpoints and prompt cache, and the text's figures.
    text = srv.log_file.read_text()
    swa_cells, full_cells = _swa_cells(text)
    assert (ft["model_memory"], ft["swa_cells"], ft["full_cells"]) == ("sliding_window", swa_cells, full_cells)
    assert ft["full_reprocess_lines"] == text.count("forcing full prompt re-processing") == 1
    assert ft["checkpoints_invalidated"] == text.count("erased invalidated context checkpoint")
    assert "context checkpoints disabled" in text and ft["checkpoint_limit"] == 0
    assert "prompt cache is disabled" in text and ft["prompt_cache_enabled"] is False
    assert f"its SWA cache holds {swa_cells:,} cells (the full-attention cache {full_cells:,})" in words
    assert "re-processed a whole prompt once (`forcing full prompt re-processing`)" in words
    assert f"--swa-full keeps the whole window ({full_cells:,} SWA cells instead of {swa_cells:,}" in words
    assert "--ctx-checkpoints N turns context checkpoints on (they are disabled)" in words
    assert "--cache-ram N keeps earlier prompts in host memory (the prompt cache is disabled)" in words


@pytest.mark.parametrize("checkpoints", [1, 8])
def test_a_conversation_back_after_its_checkpoint_was_evicted_is_re_processed_whole(
    llama_server_bin: Path, tiny_gemma2_model: Path, tmp_path: Path, checkpoints: int
) -> None:
    """A turn (~250 tokens), the next (~660), then the first turn again with another ending: its checkpoint near
    the first turn's end is the only way back past the sliding window. One checkpoint a slot: the next turn's
    evicted it, the prompt is re-processed whole (`full_reprocess`); eight: it is restored (`checkpoint_restored`)."""
    args = [*ARGS[: ARGS.index("-ctxcp")], "-ctxcp", str(checkpoints), "-cms", "64", *ARGS[ARGS.index("-ctxcp") + 2 :]]
    base = make_prompt(800)
    prompts = [base[:300], base, base[:300] + " DIFFERENT " + make_prompt(110)[::-1]]
    with (
        LlamaServer(llama_server_bin, tiny_gemma2_model, args, log_file=tmp_path / "ls.log") as srv,
        ExporterProcess(srv.log_file) as exporter,
    ):
        text = _send(srv, prompts)
        expected = _outcomes(text)
        back = "full_reprocess" if checkpoints == 1 else "checkpoint_restored"
        assert {k: len(v) for k, v in expected.items()} == {"cold": 2, back: 1}, _said(text)  # 2nd turn: mostly new
        wait_for(lambda: _counted(exporter, expected, len(prompts)), timeout=15, what="three first tokens counted")
        ft, words = _diagnose_gives_the_same_split(srv.log_file, expected, exporter)
    assert ft["checkpoint_limit"] == checkpoints and f"context checkpoints enabled, max = {checkpoints}," in text
    assert ft["checkpoints_evicted"] == text.count("erasing old context checkpoint")
    assert ft["checkpoints_restored"] == text.count("restored context checkpoint") == (checkpoints > 1)
    if checkpoints == 1:
        assert ft["checkpoints_evicted"] > 0 and ft["full_reprocess_lines"] == 1
        invalidated = text.count("erased invalidated context checkpoint")
        assert invalidated > 0 and ft["checkpoints_invalidated"] == invalidated
        was = "s were" if invalidated != 1 else " was"
        assert f"no context checkpoint covered it; {invalidated:,} context checkpoint{was} invalidated" in words
        swa_cells, full_cells = _swa_cells(text)
        assert f"--swa-full keeps the whole window ({full_cells:,} SWA cells instead of {swa_cells:,}" in words
        assert (
            f"--ctx-checkpoints N keeps more checkpoints than 1 per slot ({ft['checkpoints_evicted']:,} were erased "
            "to make room)" in words
        )
        assert "--cache-ram N keeps earlier prompts in host memory (the prompt cache is disabled)" in words
    else:
        assert ft["full_reprocess_lines"] == 0 and ft["advice"] == [] and "What helps" not in words


def _body(prompt: str) -> dict[str, Any]:
    """Eight tokens always (no end of text at random): the slot's state after a request is the same every run."""
    return {"prompt": prompt, "n_predict": 8, "cache_prompt": True, "ignore_eos": True, "seed": 1}


def _send(srv: LlamaServer, prompts: list[str]) -> str:
    """Send the prompts one after the other; the log once it has every request's timings."""
    for prompt in prompts:
        status, body = http_json(srv.url + "/completion", body=_body(prompt), timeout=60)
        assert status == 200, body
    wait_for(lambda: srv.log_text().count("total time =") == len(prompts), timeout=15, what="every request's timings")
    return srv.log_text()


def _said(text: str) -> str:
    """The log's lines about each task's cache, for a failure's message."""
    keep = ("new prompt", "cached n_tokens", "checkpoint", "forcing", "prompt eval time")
    return "\n".join(line for line in text.splitlines() if any(k in line for k in keep))


def _counted(exporter: ExporterProcess, expected: dict[str, list[float]], n: int) -> bool:
    return sum(exporter.sample("llamacpp_time_to_first_token_seconds_count", {"cache": k}) or 0 for k in expected) == n


def _swa_cells(text: str) -> tuple[int, int]:
    swa = re.search(r"creating +SWA KV cache, size = (\d+) cells", text)
    full = re.search(r"creating non-SWA KV cache, size = (\d+) cells", text)
    assert swa is not None and full is not None
    return int(swa[1]), int(full[1])


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


def _diagnose_gives_the_same_split(
    log: Path, expected: dict[str, list[float]], exporter: ExporterProcess
) -> tuple[dict[str, Any], str]:
    """`diagnose --json` and its text on the same log: the exporter's counts and sums by cache outcome, the
    share of full re-processing; the run's `first_tokens` and the text (its words joined by one space)."""
    (run,) = json.loads(_diagnose(log, "--json"))["runs"]
    ft = run["first_tokens"]
    got = {o["cache"]: o for o in ft["outcomes"]}
    assert list(got) == [k for k in CACHE_OUTCOMES if k in expected]  # CACHE_OUTCOMES' order
    for outcome, seconds in expected.items():
        o = got[outcome]
        assert o["requests"] == len(seconds)
        assert o["requests"] == exporter.sample("llamacpp_time_to_first_token_seconds_count", {"cache": outcome})
        assert o["seconds"] == pytest.approx(sum(seconds), rel=1e-9)
        assert o["seconds"] == pytest.approx(
            exporter.sample("llamacpp_time_to_first_token_seconds_sum", {"cache": outcome}), rel=1e-9
        )
        assert o["max_s"] == max(seconds) and o["p50_s"] == sorted(seconds)[(len(seconds) - 1) // 2]
    total = sum(sum(v) for v in expected.values())
    full = sum(expected.get("full_reprocess", []))
    assert ft["seconds"] == pytest.approx(total, rel=1e-9)
    assert ft["full_reprocess_share"] == pytest.approx(full / total, rel=1e-9)
    words = " ".join(_diagnose(log).split())
    for outcome, seconds in expected.items():
        assert f"{outcome} {len(seconds)} {sum(seconds):,.3f}" in words
    n = len(expected.get("full_reprocess", []))
    requests = sum(len(v) for v in expected.values())
    of = f"{n} of {requests} requests" if n else f"none of {requests} requests"
    assert (
        f"Of the {total:,.3f} s spent on first tokens, {full / total * 100:.1f} % was full re-processing ({of})."
        in words
    )
    return ft, words


@pytest.mark.parametrize("kind", ["recurrent", "hybrid"])
def test_a_recurrent_state_re_processes_every_prompt_that_does_not_continue_it(
    llama_server_bin: Path, request: pytest.FixtureRequest, tmp_path: Path, kind: str
) -> None:
    """A tiny Mamba (recurrent) and a tiny Jamba (hybrid), checkpoints and the prompt cache off: a cold prompt,
    then two that do not continue the slot's state exactly (its generated tokens are in it): each re-processed
    whole. `diagnose` names the model's memory from its start-up lines."""
    model: Path = request.getfixturevalue("tiny_mamba_model" if kind == "recurrent" else "tiny_jamba_model")
    base = make_prompt(300)
    prompts = [base, base + " and more", base[:150] + " DIFFERENT " + make_prompt(110)[::-1]]
    with (
        LlamaServer(llama_server_bin, model, ARGS, log_file=tmp_path / "ls.log") as srv,
        ExporterProcess(srv.log_file) as exporter,
    ):
        text = _send(srv, prompts)
        expected = _outcomes(text)
        assert {k: len(v) for k, v in expected.items()} == {"cold": 1, "full_reprocess": 2}, _said(text)
        wait_for(lambda: _counted(exporter, expected, len(prompts)), timeout=15, what="three first tokens counted")
        ft, words = _diagnose_gives_the_same_split(srv.log_file, expected, exporter)
    assert re.search(r"llama_memory_recurrent: size = .*cells", text) and "creating     SWA" not in text
    assert bool(re.search(r"llama_kv_cache: size = .*cells", text)) == (kind == "hybrid")
    assert (ft["model_memory"], ft["swa_cells"]) == (kind, None)
    assert ft["full_reprocess_lines"] == text.count("forcing full prompt re-processing") == 2
    named = "a recurrent model" if kind == "recurrent" else "a hybrid model (attention and recurrent layers)"
    assert f"The model is {named}." in words
    assert (
        "re-processed a whole prompt 2 times (`forcing full prompt re-processing`): its recurrent state cannot be "
        "rolled back to an earlier token" in words
    )
    assert "--swa-full" not in words and "--ctx-checkpoints N turns context checkpoints on" in words
