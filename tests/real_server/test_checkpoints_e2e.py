"""Checkpoints, prompt cache and prompt timings against a real llama-server (b11434) with a tiny gemma2.

The request sequence is pinned to slot 0 and built so that the server creates, evicts (oldest and
"too close"), invalidates and restores checkpoints, as in captures/b11434/checkpoints-swa-lv4.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from llama_harness import ExporterProcess, LlamaServer, http_json, make_prompt, wait_for

from exporter.logs.parse import normalize

pytestmark = pytest.mark.llama_server

CKPT_ARGS = ["-c", "4096", "-np", "2", "-kvu", "-ctxcp", "3", "-cms", "64", "-b", "128", "-ub", "128", "-t", "2"]

_SLOT = re.compile(r"^slot\s+\S+: id\s+(\d+) \| task -?\d+ \| (.*)$")
_CREATED = re.compile(
    r"created context checkpoint \d+ of \d+ \(pos_min = (-?\d+), pos_max = (-?\d+).*size = ([\d.]+) MiB"
)
_ERASED = re.compile(r"(?:erasing|erased) .*context checkpoint.*\(pos_min = (-?\d+), pos_max = (-?\d+),")


def _prompts() -> list[str]:
    """Five prompts that walk one slot through every checkpoint event (tiny model: ~0.83 tokens/char)."""
    base = make_prompt(300)  # > 256 tokens with the next two: the SWA cells roll over
    p3 = base + "Another ten wor"
    p4 = p3[:150] + " DIFFERENT " + make_prompt(110)[::-1]  # diverges at ~125: invalidates, checkpoint there
    return [base, base + "Another ten", p3, p4, p4[:149] + "Yet another branch of text here"]  # last: restore


def _run_requests(url: str) -> int:
    for prompt in _prompts():
        status, body = http_json(
            url + "/completion", body={"prompt": prompt, "n_predict": 8, "cache_prompt": True, "id_slot": 0}, timeout=60
        )
        assert status == 200, body
    return len(_prompts())


def _implied(log_text: str) -> tuple[dict[int, dict[tuple[int, int], float]], tuple[int, float] | None]:
    """Live checkpoints per slot and the last prompt-cache state, as the log states them."""
    live: dict[int, dict[tuple[int, int], float]] = {}
    cache = None
    for msg in (normalize(line) for line in log_text.splitlines()):
        if m := re.search(r"cache state: (\d+) prompts, ([\d.]+) MiB", msg):
            cache = (int(m[1]), float(m[2]))
        sm = _SLOT.match(msg)
        if not sm:
            continue
        slot = live.setdefault(int(sm[1]), {})
        if m := _CREATED.search(sm[2]):
            slot[(int(m[1]), int(m[2]))] = float(m[3])
        elif m := _ERASED.search(sm[2]):
            del slot[(int(m[1]), int(m[2]))]
        elif sm[2].startswith("clearing prompt with"):
            slot.clear()
    return live, cache


@pytest.fixture
def gemma_server(llama_server_bin: Path, tiny_gemma2_model: Path, tmp_path: Path) -> Iterator[LlamaServer]:
    with LlamaServer(
        llama_server_bin, tiny_gemma2_model, [*CKPT_ARGS, "-lv", "4"], log_file=tmp_path / "ls.log"
    ) as srv:
        yield srv


def test_checkpoint_metrics_follow_a_real_server(gemma_server: LlamaServer) -> None:
    with ExporterProcess(gemma_server.log_file) as exporter:
        finished = _run_requests(gemma_server.url)
        wait_for(lambda: gemma_server.log_text().count("stop processing") == finished, timeout=15, what="releases")
        text = gemma_server.log_text()
        counts = {
            "created": text.count("created context checkpoint"),
            "evicted": text.count("erasing old context checkpoint")
            + text.count("erasing context checkpoint too close"),
            "invalidated": text.count("erased invalidated context checkpoint"),
            "restored": text.count("restored context checkpoint"),
            "failed_restore": text.count("failed to restore context checkpoint"),
        }
        # The sequence must really exercise every kind of event, or this test proves little.
        assert all(counts[k] > 0 for k in ("created", "evicted", "invalidated", "restored")), counts

        def counted(event: str, n: int) -> bool:
            return exporter.sample("llamacpp_checkpoint_events_total", {"event": event}) == n

        for event, n in counts.items():
            wait_for(partial(counted, event, n), timeout=15, what=f"checkpoint_events_total{{{event}}} == {n}")
        assert exporter.sample("llamacpp_full_reprocess_total") == text.count("forcing full prompt re-processing")

        live, cache = _implied(text)
        for slot in (0, 1):
            want = live.get(slot, {})
            assert exporter.sample("llamacpp_checkpoints", {"slot": str(slot)}) == len(want)
            got = exporter.sample("llamacpp_checkpoint_bytes", {"slot": str(slot)})
            assert got == pytest.approx(sum(want.values()) * 2**20, abs=0.0005 * 2**20)
        assert exporter.sample("llamacpp_checkpoint_limit") == 3
        if cache is not None:
            assert exporter.sample("llamacpp_prompt_cache_prompts") == cache[0]
            assert exporter.sample("llamacpp_prompt_cache_bytes") == pytest.approx(cache[1] * 2**20)
        assert exporter.sample("llamacpp_prompt_cache_limit_bytes") == 8192 * 2**20

        # Prompt evaluation: one observation per finished request, summing the log's own figures.
        evals = [float(ms) for ms in re.findall(r"prompt eval time = +([\d.]+) ms", text)]
        assert len(evals) == finished
        assert exporter.sample("llamacpp_prompt_eval_seconds_count") == finished
        assert exporter.sample("llamacpp_prompt_eval_seconds_sum") == pytest.approx(sum(evals) / 1000, abs=0.001)
        tokens = sum(int(n) for n in re.findall(r"prompt eval time = +[\d.]+ ms / +(\d+) tokens", text))
        assert exporter.sample("llamacpp_prompt_tokens_total") == tokens

        # A llama-server restart empties the slots' checkpoints and the prompt cache.
        starts = exporter.sample("llamacpp_server_starts_total") or 0
        gemma_server.kill9()
        gemma_server.restart()
        wait_for(lambda: exporter.sample("llamacpp_server_starts_total") == starts + 1, timeout=15, what="restart seen")
        wait_for(lambda: exporter.sample("llamacpp_prompt_cache_bytes") == 0, timeout=15, what="cache reset")
        assert exporter.sample("llamacpp_checkpoints", {"slot": "0"}) == 0
        assert exporter.sample("llamacpp_checkpoint_bytes", {"slot": "0"}) == 0
        assert exporter.sample("llamacpp_prompt_cache_prompts") == 0
        assert exporter.sample("llamacpp_checkpoint_events_total", {"event": "created"}) == counts["created"]


def test_default_verbosity_says_checkpoints_are_hidden(
    llama_server_bin: Path, tiny_gemma2_model: Path, tmp_path: Path
) -> None:
    """At -lv 3 the checkpoint lines are trace level: a metric and one log line say so, no fake zeros."""
    with (
        LlamaServer(llama_server_bin, tiny_gemma2_model, CKPT_ARGS, log_file=tmp_path / "ls.log") as srv,
        ExporterProcess(srv.log_file) as exporter,
    ):
        finished = _run_requests(srv.url)
        assert "created context checkpoint" not in srv.log_text()
        wait_for(
            lambda: exporter.sample("llamacpp_prompt_eval_seconds_count") == finished, timeout=15, what="timings seen"
        )
        assert exporter.sample("llamacpp_checkpoint_lines_visible") == 0
        scrape = exporter.scrape()
        for hidden in ("llamacpp_checkpoints{", "llamacpp_checkpoint_bytes{", "llamacpp_prompt_cache_bytes "):
            assert hidden not in scrape
        exporter.stop()
        output = exporter.output_file.read_text()
        assert output.count("checkpoint and prompt-cache lines are hidden") == 1, output
