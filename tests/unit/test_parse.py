"""Parser tests: every wording in shared/reference/llama-server-logs.md that feeds a metric, b3761 → b11434.

The b11434 wordings are also covered line-for-line by the golden tests on real captures.
"""

from __future__ import annotations

import json
import re

import pytest
from paths import B11434

from exporter.logs import events as ev
from exporter.logs.parse import normalize, parse_line, unwrap

CASES: list[tuple[str, ev.Event]] = [
    # --- start-up and configuration
    ("0.00.003.960 I srv  llama_server: initializing ...", ev.ServerStarting()),
    (
        "build: 4747 (c392e509) with cc (Ubuntu 13.3.0) 13.3.0 for x86_64-linux-gnu",
        ev.BuildInfo(4747, "c392e509"),
    ),
    ("build: 0 (unknown) with cc (Debian 12.2.0-14+deb12u1) 12.2.0 for x86_64-linux-gnu", ev.BuildInfo(0, "unknown")),
    (
        "build: 0 (v0.3.16+cpu) with cc (GCC) 13.3.0 for x86_64-linux-gnu",
        ev.BuildInfo(0, "v0.3.16+cpu"),
    ),  # a packager's
    ("main: build_info: b8668-5d3a4a7da", ev.BuildInfo(8668, "5d3a4a7da")),
    ("build_info: b8668-5d3a4a7da", ev.BuildInfo(8668, "5d3a4a7da")),
    (
        "0.00.005.046 I cmn  common_param: common_params_print_info: build 11434 (b11434) with GNU 12.2.0 for Linux",
        ev.BuildInfo(11434, "b11434"),
    ),
    (
        "I common_params_print_info: build 9284 (afcda09d1) with GNU 11.4.0 for Linux x86_64",
        ev.BuildInfo(9284, "afcda09d1"),
    ),
    ("0.00.000.100 I log_info: verbosity = 3 (adjust with the `-lv N` CLI arg)", ev.Verbosity(3)),
    (
        "srv    load_model: initializing, n_slots = 4, n_ctx_slot = 131072, kv_unified = 'true'",
        ev.SlotsInitialized(4, 131072, True),
    ),
    ("srv          init: initializing slots, n_slots = 4", ev.SlotsInitialized(4)),
    ("srv    load_model: initializing slots, n_slots = 2", ev.SlotsInitialized(2)),
    ("slot         init: id  0 | task -1 | new slot n_ctx_slot = 4096", ev.SlotCreated(0, 4096)),
    ("slot   load_model: id 12 | task -1 | new slot, n_ctx = 16384", ev.SlotCreated(12, 16384)),
    ("llama_context: n_ctx         = 131072", ev.ContextParam("n_ctx", 131072)),
    ("llama_new_context_with_model: n_ctx      = 4096", ev.ContextParam("n_ctx", 4096)),
    ("llama_init_from_model: n_ctx_per_seq = 2048", ev.ContextParam("n_ctx_seq", 2048)),
    ("llama_context: n_ctx_seq             = 512", ev.ContextParam("n_ctx_seq", 512)),
    ("llama_context: n_seq_max     = 4", ev.ContextParam("n_seq_max", 4)),
    ("llama_context: kv_unified    = true", ev.ContextParam("kv_unified", 1)),
    ("llama_context: kv_unified            = false", ev.ContextParam("kv_unified", 0)),
    (
        "llama_kv_cache: size = 16384.00 MiB (131072 cells,  32 layers,  4/1 seqs), "
        "K (f16): 8192.00 MiB, V (f16): 8192.00 MiB",
        ev.KVCacheSize(16384.0, 131072, 4, 1, "f16", 8192.0, "f16", 8192.0),
    ),
    (
        "llama_kv_cache: size = 4096.00 MiB (  8192 cells,  32 layers,  4/4 seqs), "
        "K (q8_0): 2048.00 MiB, V (q8_0): 2048.00 MiB",
        ev.KVCacheSize(4096.0, 8192, 4, 4, "q8_0", 2048.0, "q8_0", 2048.0),
    ),
    (
        "llama_kv_cache_unified: size =  512.00 MiB (  4096 cells,  32 layers,  1/ 1 seqs), "
        "K (f16):  256.00 MiB, V (f16):  256.00 MiB",
        ev.KVCacheSize(512.0, 4096, 1, 1, "f16", 256.0, "f16", 256.0),
    ),
    (
        "llama_kv_cache_unified: size =  512.00 MiB (  4096 cells,  32 layers), K (f16):  256.00 MiB, V (f16):  256.00 MiB",
        ev.KVCacheSize(512.0, 4096, None, None, "f16", 256.0, "f16", 256.0),
    ),
    (
        "llama_new_context_with_model: KV self size  =  512.00 MiB, K (f16):  256.00 MiB, V (f16):  256.00 MiB",
        ev.KVCacheSize(512.0, None, None, None, "f16", 256.0, "f16", 256.0),
    ),
    ("llama_kv_cache_iswa: creating     SWA KV cache, size = 256 cells", ev.KVCacheSection(True, 256)),
    ("llama_kv_cache_iswa: creating non-SWA KV cache, size = 4096 cells", ev.KVCacheSection(False, 4096)),
    (
        "llama_memory_recurrent: size =    0.02 MiB (     1 cells,   2 layers,  1 seqs  0 rs_seq), R (f32):    0.00 MiB, S (f32):    0.02 MiB, P (f32):    0.00 MiB",
        ev.RecurrentMemory(1),
    ),
    (
        "srv    load_model: capping per-slot context (16384) to --kv-unified-per-slot (4096)",
        ev.PerSlotCap(16384, 4096),
    ),
    ("srv    load_model: loading model 'models/tiny-llama.gguf'", ev.ModelLoading("models/tiny-llama.gguf")),
    (
        "main: server is listening on 127.0.0.1:8080 - starting the main loop",
        ev.ServerReady("127.0.0.1:8080"),
    ),
    (
        "main: server is listening on http://127.0.0.1:8080 - starting the main loop",
        ev.ServerReady("http://127.0.0.1:8080"),
    ),
    ("srv  llama_server: server is listening on http://0.0.0.0:8080", ev.ServerReady("http://0.0.0.0:8080")),
    (
        "0.00.014.488 I srv  llama_server: listening on http://127.0.0.1:18080",
        ev.ServerReady("http://127.0.0.1:18080"),
    ),
    # --- slot lifecycle, every era
    ("slot launch_slot_: id  0 | task 42 | processing task", ev.TaskStarted(0, 42)),
    ("slot launch_slot_: id  3 | task 2 | processing task, is_child = 0", ev.TaskStarted(3, 2)),
    (
        "slot update_slots: id  0 | task 42 | prompt tokenized, n_ctx_slot = 4096, n_keep = 0, n_prompt_tokens = 20",
        ev.NewPrompt(0, 42, 4096, 20),
    ),
    (
        "slot update_slots: id  0 | task 42 | new prompt, n_ctx_slot = 4096, n_keep = 0, n_prompt_tokens = 1234",
        ev.NewPrompt(0, 42, 4096, 1234),
    ),
    (
        "slot update_slots: id  0 | task 42 | new prompt, n_ctx_slot = 4096, n_keep = -1, task.n_tokens = 1234",
        ev.NewPrompt(0, 42, 4096, 1234),
    ),
    ("slot update_slots: id  0 | task 42 | kv cache rm [17, end)", ev.CachedTokens(0, 42, 17)),
    ("slot update_slots: id  0 | task 42 | n_past = 17, memory_seq_rm [17, end)", ev.CachedTokens(0, 42, 17)),
    (
        "slot update_slots: id  0 | task 42 | n_tokens = 17, memory_seq_rm [17, end)",
        ev.CachedTokens(0, 42, 17),
    ),
    (
        "slot   pre_decode: id  1 | task 7 | cached n_tokens = 33, memory_seq_rm [33, end)",
        ev.CachedTokens(1, 7, 33),
    ),
    (
        "slot update_slots: id  0 | task 42 | prompt processing progress, n_past = 2048, n_tokens = 2048, progress = 0.5",
        ev.PromptProgress(0, 42, 2048, absolute=True, progress=0.5),
    ),
    (
        "slot update_slots: id  0 | task 42 | prompt processing progress, n_tokens = 2048, batch.n_tokens = 2048, "
        "progress = 0.500000",
        ev.PromptProgress(0, 42, 2048, absolute=True, progress=0.5),
    ),
    (
        "slot update_slots: id  0 | task 42 | prompt done, n_past = 4096, n_tokens = 12",
        ev.PromptProgress(0, 42, 4096, True),
    ),
    (
        "slot update_slots: id  0 | task 42 | prompt processing done, n_tokens = 4096, batch.n_tokens = 12",
        ev.PromptProgress(0, 42, 4096, absolute=True),
    ),
    (
        "slot print_timing: id  0 | task 42 | prompt processing, n_tokens =   8192, progress = 0.35, "
        "t =   3.21 s / 2552.02 tokens per second",
        ev.PromptProgress(0, 42, 8192, absolute=False, progress=0.35, seconds=3.21, rate=2552.02),
    ),
    (
        "slot print_timing: id  0 | task 42 | n_decoded =    300, tg =  41.23 t/s, tg_3s =  40.87 t/s",
        ev.GenerationProgress(0, 42, 300, rate=40.87),
    ),
    (
        "slot print_timing: id  0 | task 42 | n_decoded =    300, tg =  41.23 t/s",
        ev.GenerationProgress(0, 42, 300, rate=41.23),
    ),
    (
        "0.03.195.497 I slot print_timing: id  2 | task 20 | n_gen =   2714, tg = 904.33 t/s, tg_3s = 904.66 t/s",
        ev.GenerationProgress(2, 20, 2714, rate=904.66),
    ),
    (
        "slot      release: id  0 | task 42 | stop processing: n_past = 275, truncated = 0",
        ev.SlotReleased(0, 42, 275),
    ),
    (
        "slot      release: id  0 | task 42 | stop processing: n_tokens = 275, truncated = 1",
        ev.SlotReleased(0, 42, 275),
    ),
    ("slot   clear_slot: id  2 | task 17 | clearing slot with 3000 tokens", ev.SlotCleared(2, 3000)),
    ("slot prompt_clear: id  2 | task -1 | clearing prompt with 129 tokens", ev.SlotCleared(2, 129)),
    ("slot process_sing: id  1 | task -1 | saving idle slot to prompt cache", ev.IdleSlotSaved(1)),
    ("srv  try_purge_id: purging slot 2 with 3000 tokens", ev.SlotPurged(2, 3000)),
    ("W srv  try_clear_id: purging slot 0 with 562 tokens", ev.SlotPurged(0, 562)),
    (
        "srv          init: idle slots will be saved to prompt cache and cleared upon starting a new task",
        ev.IdleSlotPolicy(clear_on_new_task=True),
    ),
    ("srv  update_slots: all slots are idle", ev.AllSlotsIdle()),
    # --- the cascade, every era
    ("decode: failed to find KV cache slot for ubatch of size 512", ev.MemorySlotFailure(512)),
    ("llama_decode: failed to find KV cache slot for batch of size 512", ev.MemorySlotFailure(512)),
    ("W decode: failed to find a memory slot for batch of size 4", ev.MemorySlotFailure(4)),
    (
        "srv  update_slots: failed to find free space in the KV cache, retrying with smaller batch size - try "
        "increasing it via the context size or enable defragmentation, i = 0, n_batch = 64, ret = 1",
        ev.KVRetry(0, 64),
    ),
    (
        "srv  update_slots: failed to find free space in the KV cache, retrying with smaller batch size, "
        "i = 512, n_batch = 256, ret = 1",
        ev.KVRetry(512, 256),
    ),
    (
        "W srv        decode: failed to find free space in the KV cache, retrying with smaller batch size, "
        "off = 2, n_batch = 1, ret = 1",
        ev.KVRetry(2, 1),
    ),
    (
        "srv  update_slots: failed to decode the batch: KV cache is full - try increasing it via the context size, "
        "i = 0, n_batch = 1, ret = 1",
        ev.DecodeFatal("context_exceeded"),
    ),
    (
        "srv  update_slots: Context size has been exceeded., i = 0, n_batch = 1, ret = 1",
        ev.DecodeFatal("context_exceeded"),
    ),
    (
        "srv  update_slots: Context size has been exceeded. i = 0, n_batch = 1, ret = 1",
        ev.DecodeFatal("context_exceeded"),
    ),
    (
        "E srv        decode: Context size has been exceeded. off = 3, n_batch = 1, ret = 1",
        ev.DecodeFatal("context_exceeded"),
    ),
    ("srv  update_slots: Compute error. i = 0, n_batch = 512, ret = -3", ev.DecodeFatal("compute_error")),
    (
        "srv  update_slots: Invalid input batch. i = 0, n_batch = 512, ret = -1",
        ev.DecodeFatal("invalid_batch"),
    ),
    (
        "E srv  update_slots: decode() failed: Context size has been exceeded.",
        ev.DecodeFailed("Context size has been exceeded."),
    ),
    (
        "E srv    send_error: task id = 24, error: Context size has been exceeded.",
        ev.RequestError(24, "context_exceeded"),
    ),
    (
        "srv    send_error: task id = 3, error: Input prompt is too big compared to KV size. Please try increasing KV size.",
        ev.RequestError(3, "context_exceeded"),
    ),
    (
        "srv    send_error: task id = 9, error: request (5000 tokens) exceeds the available context size "
        "(4096 tokens), try increasing it",
        ev.RequestError(9, "prompt_too_long"),
    ),
    ("srv    send_error: task id = 9, error: something new upstream", ev.RequestError(9, "other")),
    # --- timings: b9230+ one tagged line each; before that untagged continuation lines
    ("slot print_timing: id  3 | task 2 | ", ev.TimingsHead(3, 2)),
    (
        "slot print_timing: id  3 | task 2 | prompt eval time =       0.67 ms /    34 tokens (    0.02 ms per token, 51051.05 tokens per second)",
        ev.PromptEvalTiming(0.67, 34),
    ),
    (
        "slot print_timing: id  3 | task 2 |        eval time =       0.83 ms /    16 tokens (    0.06 ms per token, 17985.61 tokens per second)",
        ev.GenerationTiming(0.83, 16),
    ),
    (
        "prompt eval time =     300.11 ms /    20 tokens (   15.01 ms per token,    66.64 tokens per second)",
        ev.PromptEvalTiming(300.11, 20),
    ),
    (
        "       eval time =    2296.72 ms /   256 tokens (    8.97 ms per token,   111.46 tokens per second)",
        ev.GenerationTiming(2296.72, 256),
    ),
    (
        "0.00.082.283 I slot print_timing: id  0 | task 0 |       total time =      28.46 ms /   257 tokens",
        ev.TotalTiming(28.46, 257),
    ),
    ("      total time =      34.75 ms /   257 tokens", ev.TotalTiming(34.75, 257)),
    # --- checkpoints, b6160 → b11434
    (
        "slot create_check: id  0 | task 42 | created context checkpoint 3 of 32 (pos_min = 0, pos_max = 16383, n_tokens = 16384, size = 62.813 MiB)",
        ev.CheckpointCreated(0, 3, 32, 0, 16383, 62.813),
    ),
    (
        "slot update_slots: id  0 | task 42 | created context checkpoint 2 of 8 (pos_min = 0, pos_max = 4095, size = 250.125 MiB)",
        ev.CheckpointCreated(0, 2, 8, 0, 4095, 250.125),
    ),
    (
        "slot update_slots: id  1 | task 42 | saved context checkpoint 1 of 3 (pos_min = 0, pos_max = 4095, size = 250.125 MiB)",
        ev.CheckpointCreated(1, 1, 3, 0, 4095, 250.125),
    ),
    (
        "slot update_slots: id  0 | task 42 | SWA checkpoint create, pos_min = 0, pos_max = 511, size = 1.500 MiB, total = 2/3 (3.000 MiB)",
        ev.CheckpointCreated(0, 2, 3, 0, 511, 1.5),
    ),
    (
        "W slot create_check: id  0 | task 14 | erasing old context checkpoint (pos_min = 0, pos_max = 111, n_tokens = 112, size = 0.004 MiB)",
        ev.CheckpointRemoved(0, "evicted", 0, 111, 0.004),
    ),
    (
        "slot update_slots: id  0 | task 14 | erasing old context checkpoint (pos_min = 0, pos_max = 111, size = 0.004 MiB)",
        ev.CheckpointRemoved(0, "evicted", 0, 111, 0.004),
    ),
    (
        "slot create_check: id  0 | task 25 | erasing context checkpoint too close to an earlier one (pos_min = 0, pos_max = 239, n_tokens = 240, size = 0.004 MiB)",
        ev.CheckpointRemoved(0, "evicted", 0, 239, 0.004),
    ),
    (
        "slot   operator(): id  0 | task 35 | erased invalidated context checkpoint (pos_min = 0, pos_max = 235, n_tokens = 236, n_swa = 32, pos_next = 121, size = 0.004 MiB)",
        ev.CheckpointRemoved(0, "invalidated", 0, 235, 0.004),
    ),
    (
        "slot update_slots: id  0 | task 35 | erased invalidated context checkpoint (pos_min = 0, pos_max = 235, n_swa = 32, size = 0.004 MiB)",
        ev.CheckpointRemoved(0, "invalidated", 0, 235, 0.004),
    ),
    (
        "slot update_slots: id  0 | task 1 | SWA checkpoint erase, pos_min = 0, pos_max = 511, size = 1.500 MiB",
        ev.CheckpointRemoved(0, "evicted", 0, 511, 1.5),
    ),
    (
        "slot   operator(): id  0 | task 46 | restored context checkpoint (pos_min = 15, pos_max = 120, n_tokens = 121, n_past = 120, size = 0.004 MiB)",
        ev.CheckpointRestored(0),
    ),
    (
        "slot update_slots: id  0 | task 4 | SWA checkpoint restore, pos_min = 0, pos_max = 511, size = 1.500 MiB",
        ev.CheckpointRestored(0),
    ),
    (
        "E slot update_slots: id  1 | task 4 | failed to restore context checkpoint (pos_min = 0, pos_max = 511, size = 1.500 MiB)",
        ev.CheckpointRestoreFailed(1),
    ),
    (
        "slot create_check: id  1 | task 4 | superseding context checkpoint at n_tokens = 512",
        ev.CheckpointSuperseded(1, 512),
    ),
    (
        "slot   pre_decode: id  0 | task 42 | forcing full prompt re-processing due to lack of cache data (likely due to SWA or hybrid/recurrent memory, see https://github.com/ggml-org/llama.cpp/pull/13194#issuecomment-2868343055)",
        ev.FullReprocess(0),
    ),
    ("srv    load_model: context checkpoints enabled, max = 32, min spacing = 8192", ev.CheckpointConfig(32)),
    ("srv    load_model: context checkpoints disabled", ev.CheckpointConfig(0)),
    # --- prompt cache
    ("srv    load_model: prompt cache is enabled, size limit: 8192 MiB", ev.PromptCacheLimit(8192.0)),
    ("srv    load_model: prompt cache is enabled, size limit: no limit", ev.PromptCacheLimit(None)),
    ("srv    load_model: prompt cache is disabled - use `--cache-ram N` to enable it", ev.PromptCacheLimit(0.0)),
    ("W srv         alloc:  - cache size limit reduced to 2048.000 MiB", ev.PromptCacheLimit(2048.0)),
    (
        "srv        update:  - cache state: 1 prompts, 0.049 MiB (limits: 8192.000 MiB, 4096 tokens, 45117300 est)",
        ev.PromptCacheState(1, 0.049, 8192.0),
    ),
    (
        "srv   prompt_save:  - saving prompt with length 271, total state size = 0.041 MiB (draft: 0.000 MiB)",
        ev.PromptSaved(271, 0.041),
    ),
    ("srv   prompt_save:  - saving prompt with length 271, total state size = 0.041 MiB", ev.PromptSaved(271, 0.041)),
    (
        "srv          load:    - prompt with length     271, lcp =     121, f_keep = 0.446, f_sim = 0.538",
        ev.PromptCacheCandidate(271, "0.446", "0.538"),
    ),
    ("srv          load:  - found better prompt with f_keep = 0.694, f_sim = 1.000", ev.PromptLoaded("0.694", "1.000")),
    ("srv         alloc:  - removing obsolete cached prompt with length 49", ev.PromptCacheRemoved(49)),
    (
        "W srv         alloc:  - making room for prompt cache entry, removing oldest entry (size = 250.000 MiB)",
        ev.PromptCacheRemoved(None),
    ),
    ("slot get_availabl: id  3 | task -1 | selected slot by LRU, t_last = -1", ev.SlotSelected(3)),
]


@pytest.mark.parametrize(("line", "expected"), CASES, ids=[c[0][:60] for c in CASES])
def test_wordings(line: str, expected: ev.Event) -> None:
    assert parse_line(line) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "\x1b[34m0.00.064.190\x1b[0m \x1b[31mE srv        decode: Context size has been exceeded. off = 3, n_batch = 1, ret = 1",
        "\x1b[0msrv        decode: Context size has been exceeded. off = 3, n_batch = 1, ret = 1",
        "[39045] 0.01.234.567 E srv        decode: Context size has been exceeded. off = 3, n_batch = 1, ret = 1",
        json.dumps(
            {
                "type": "log",
                "time": 67023,
                "level": "error",
                "msg": "srv        decode: Context size has been exceeded. off = 0, n_batch = 1, ret = 1\n",
            }
        ),
        "62.05.123.456 E srv        decode: Context size has been exceeded. off = 3, n_batch = 1, ret = 1\r\n",
    ],
)
def test_wrappers_are_stripped(raw: str) -> None:
    assert parse_line(raw) == ev.DecodeFatal("context_exceeded")


def test_normalize_keeps_the_message() -> None:
    assert normalize("0.00.014.541 I srv  update_slots: all slots are idle") == "srv  update_slots: all slots are idle"
    assert normalize("I srv  update_slots: all slots are idle") == "srv  update_slots: all slots are idle"


@pytest.mark.parametrize(
    "line",
    [
        "",
        "   ",
        "\tdry_multiplier = 0.000, dry_base = 1.750, dry_allowed_length = 2",
        "{not json",
        '{"type":"log","msg":42}',
        "\x00\x01\x02\xff garbage",
        "slot update_slots: id  x | task y | stop processing: n_tokens = 1",
        "<|im_start|>user stop processing: n_tokens = 5 retrying with smaller batch size",
        "A" * 100_000,
        "srv  llama_server: HTTP server is listening, hostname: 127.0.0.1, port: 8080, http threads: 15",
        "llama_context: n_ctx_seq (512) < n_ctx_train (4096) -- the full capacity of the model will not be utilized",
        # A debug line with an empty message, like a timings head but not from print_timings.
        "0.00.357.325 D slot        reset: id  0 | task 4 | ",
    ],
)
def test_unknown_or_garbage_lines_are_ignored(line: str) -> None:
    assert parse_line(line) is None


def _unwrap_by_json_loads(line: str) -> str:
    """What `unwrap` must return, spelled the slow, obvious way."""
    if line.startswith("{") and '"msg"' in line:
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("msg"), str):
            line = obj["msg"].split("\n", 1)[0]
    return normalize_colours(line).rstrip("\r\n")


def normalize_colours(line: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", line)


HEAD = '{"type":"log","time":976,"level":"info","msg":'


@pytest.mark.parametrize(
    "line",
    [
        HEAD + '"srv  llama_server: initializing ...\\n"}',
        HEAD + '"a \\"quoted\\" \\\\ back\\/slash \\u00e9 \\ud83d\\ude00 \\t tab"}',
        HEAD + '"lone \\ud800 surrogate"}',
        HEAD + '"\\u001b[32mgreen\\u001b[0m srv  update_slots: all slots are idle"}',
        HEAD + '"first line\\nsecond line"}\r',
        HEAD + '"trailing spaces"}  \t ',
        HEAD + '"extra key after msg","x":1}',
        HEAD + '"two objects"}{"msg":"second"}',
        HEAD + '"bad escape \\q"}',
        HEAD + '"raw control \t char"}',
        HEAD + '"unterminated}',
        HEAD + "42}",
        HEAD + '"x"} trailing garbage',
        HEAD + '"x"}}',
        '{"type":"log","time":01,"level":"info","msg":"leading zero"}',
        '{"type":"log","time":-0,"level":"info","msg":"minus zero"}',
        '{"type":"log","time":1.5,"level":"info","msg":"float time"}',
        '{"type":"log","time":1,"level":"info","msg":"first","msg":"duplicate key wins"}',
        '{"msg":"msg first","type":"log"}',
        '{"type":"log","time":1,"level":"\\u0069nfo","msg":"escaped level"}',
        '{"type":"log","time":1,"level":"info","msg":"x"',
        "{not json",
        '{"type":"log","msg":42}',
    ],
)
def test_unwrap_equals_json_loads(line: str) -> None:
    assert unwrap(line) == _unwrap_by_json_loads(line)


def test_unwrap_equals_json_loads_on_the_jsonl_capture() -> None:
    capture = B11434 / "exhaust-jsonl" / "llama-server.log"
    lines = capture.read_text(encoding="utf-8").splitlines()
    assert len(lines) > 300
    assert [unwrap(x) for x in lines] == [_unwrap_by_json_loads(x) for x in lines]
