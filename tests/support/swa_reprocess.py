"""A real b11434 run of a tiny sliding-window gemma2 (tests/real_server/test_latency_e2e.py's setup), cut to the
lines `diagnose`'s first-token section reads (and a tiny hybrid model's run): for tests/unit/test_diagnose_first_tokens.py and the advice rules'
tests in tests/unit/test_diagnose_sizing.py."""

from __future__ import annotations

from exporter.diagnose import analyze
from exporter.diagnose.report import FirstTokens

# A cold prompt (task 0), the same conversation back (task 14: cached), and one that diverges past the window
# (task 23: `forcing full prompt re-processing`): b11434 -c 4096 -np 1 -ctxcp 0 --cache-ram 0 -b 128 -ub 128 -lv 4.
SWA_RUN = """\
0.00.003.977 I srv  llama_server: initializing ...
0.00.005.435 I cmn  common_param: common_params_print_info: build 11434 (b11434) with GNU 12.2.0 for Linux x86_64
0.00.005.436 I cmn  common_param: common_params_print_info: verbosity = 4 (adjust with the `-lv N` CLI arg)
0.00.018.421 I llama_kv_cache_iswa: creating non-SWA KV cache, size = 4096 cells
0.00.018.477 I llama_kv_cache:        CPU KV buffer size =     0.50 MiB
0.00.018.761 I llama_kv_cache: size =    0.50 MiB (  4096 cells,   1 layers,  1/1 seqs), K (f16):    0.25 MiB, V (f16):    0.25 MiB
0.00.018.778 I llama_kv_cache: n_rot_k = 0, n_embd_head_k_all = 16
0.00.018.792 I llama_kv_cache: n_rot_v = 0, n_embd_head_k_all = 16
0.00.018.807 I llama_kv_cache_iswa: creating     SWA KV cache, size = 256 cells
0.00.018.828 I llama_kv_cache:        CPU KV buffer size =     0.03 MiB
0.00.018.845 I llama_kv_cache: size =    0.03 MiB (   256 cells,   1 layers,  1/1 seqs), K (f16):    0.02 MiB, V (f16):    0.02 MiB
0.00.021.872 I srv    load_model: initializing, n_slots = 1, n_ctx_slot = 4096, kv_unified = 'false'
0.00.021.900 I spec common_specu: no implementations specified for speculative decoding
0.00.021.916 I slot   load_model: id  0 | task -1 | new slot, n_ctx = 4096
0.00.021.934 I srv    load_model: prompt cache is disabled - use `--cache-ram N` to enable it
0.00.021.949 I srv    load_model: for more info see https://github.com/ggml-org/llama.cpp/pull/16391
0.00.021.971 I srv    load_model: context checkpoints disabled
0.00.024.600 I srv  llama_server: listening on http://127.0.0.1:33877
0.00.448.659 I slot launch_slot_: id  0 | task 0 | processing task, is_child = 0
0.00.448.664 I slot   operator(): id  0 | task 0 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 663
0.00.448.669 I slot   operator(): id  0 | task 0 | cached n_tokens = 0, memory_seq_rm [0, end)
0.00.452.152 I slot   operator(): id  0 | task 0 | cached n_tokens = 128, memory_seq_rm [128, end)
0.00.455.292 I slot   operator(): id  0 | task 0 | cached n_tokens = 256, memory_seq_rm [256, end)
0.00.459.392 I slot   operator(): id  0 | task 0 | cached n_tokens = 384, memory_seq_rm [384, end)
0.00.464.856 I slot   operator(): id  0 | task 0 | cached n_tokens = 512, memory_seq_rm [512, end)
0.00.469.980 I slot   operator(): id  0 | task 0 | cached n_tokens = 640, memory_seq_rm [640, end)
0.00.470.111 I slot init_sampler: id  0 | task 0 | init sampler, took 0.07 ms, tokens: text = 663, total = 663
0.00.483.363 I slot print_timing: id  0 | task 0 | prompt eval time =      29.33 ms /   663 tokens (    0.04 ms per token, 22604.84 tokens per second)
0.00.483.418 I slot print_timing: id  0 | task 0 |        eval time =       5.36 ms /     8 tokens (    0.77 ms per token,  1306.46 tokens per second)
0.00.483.442 I slot print_timing: id  0 | task 0 |       total time =      34.69 ms /   671 tokens
0.00.483.465 I slot print_timing: id  0 | task 0 |    graphs reused =          9
0.00.483.517 I slot      release: id  0 | task 0 | stop processing: n_tokens = 670, truncated = 0
0.00.485.095 I slot launch_slot_: id  0 | task 14 | processing task, is_child = 0
0.00.485.099 I slot   operator(): id  0 | task 14 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 673
0.00.485.101 I slot   operator(): id  0 | task 14 | cached n_tokens = 663, memory_seq_rm [663, end)
0.00.485.194 I slot init_sampler: id  0 | task 14 | init sampler, took 0.07 ms, tokens: text = 673, total = 673
0.00.492.968 I slot print_timing: id  0 | task 14 | prompt eval time =       3.51 ms /    10 tokens (    0.35 ms per token,  2852.25 tokens per second)
0.00.492.998 I slot print_timing: id  0 | task 14 |        eval time =       4.36 ms /     8 tokens (    0.62 ms per token,  1605.14 tokens per second)
0.00.493.015 I slot print_timing: id  0 | task 14 |       total time =       7.87 ms /    18 tokens
0.00.493.034 I slot print_timing: id  0 | task 14 |    graphs reused =         15
0.00.493.190 I slot      release: id  0 | task 14 | stop processing: n_tokens = 680, truncated = 0
0.00.493.984 I slot launch_slot_: id  0 | task 23 | processing task, is_child = 0
0.00.493.986 I slot   operator(): id  0 | task 23 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 226
0.00.493.988 I slot   operator(): id  0 | task 23 | forcing full prompt re-processing due to lack of cache data (likely due to SWA or hybrid/recurrent memory, see https://github.com/ggml-org/llama.cpp/pull/13194#issuecomment-2868343055)
0.00.493.988 I slot   operator(): id  0 | task 23 | cached n_tokens = 0, memory_seq_rm [0, end)
0.00.496.520 I slot   operator(): id  0 | task 23 | cached n_tokens = 128, memory_seq_rm [128, end)
0.00.496.594 I slot init_sampler: id  0 | task 23 | init sampler, took 0.02 ms, tokens: text = 226, total = 226
0.00.502.541 I slot print_timing: id  0 | task 23 | prompt eval time =       5.35 ms /   226 tokens (    0.02 ms per token, 42211.43 tokens per second)
0.00.502.571 I slot print_timing: id  0 | task 23 |        eval time =       3.20 ms /     8 tokens (    0.46 ms per token,  2188.87 tokens per second)
0.00.502.589 I slot print_timing: id  0 | task 23 |       total time =       8.55 ms /   234 tokens
0.00.502.606 I slot print_timing: id  0 | task 23 |    graphs reused =         21
0.00.502.634 I slot      release: id  0 | task 23 | stop processing: n_tokens = 233, truncated = 0
"""


# A hybrid model's run (a tiny Jamba, tests/support/tiny_gguf.write_tiny_jamba): its KV cache's and its recurrent
# state's size lines; a cold prompt, then two prompts that do not continue the state, each re-processed whole.
# b11434 -c 4096 -np 1 -ctxcp 0 --cache-ram 0 -b 128 -ub 128 -lv 4.
HYBRID_RUN = """\
0.00.012.904 I cmn  common_param: common_params_print_info: build 11434 (b11434) with GNU 12.2.0 for Linux x86_64
0.00.012.906 I cmn  common_param: common_params_print_info: verbosity = 4 (adjust with the `-lv N` CLI arg)
0.00.025.241 I llama_kv_cache: size =    0.50 MiB (  4096 cells,   1 layers,  1/1 seqs), K (f16):    0.25 MiB, V (f16):    0.25 MiB
0.00.025.263 I llama_memory_recurrent: size =    0.01 MiB (     1 cells,   2 layers,  1 seqs  0 rs_seq), R (f32):    0.00 MiB, S (f32):    0.01 MiB, P (f32):    0.00 MiB
0.00.035.556 I srv    load_model: initializing, n_slots = 1, n_ctx_slot = 4096, kv_unified = 'false'
0.00.035.568 I srv    load_model: prompt cache is disabled - use `--cache-ram N` to enable it
0.00.035.569 I srv    load_model: context checkpoints disabled
0.00.038.011 I srv  llama_server: listening on http://127.0.0.1:53175
0.00.690.328 I slot launch_slot_: id  0 | task 0 | processing task, is_child = 0
0.00.690.337 I slot   operator(): id  0 | task 0 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 249
0.00.690.342 I slot   operator(): id  0 | task 0 | cached n_tokens = 0, memory_seq_rm [0, end)
0.00.693.951 I slot   operator(): id  0 | task 0 | cached n_tokens = 128, memory_seq_rm [128, end)
0.00.700.246 I slot print_timing: id  0 | task 0 | prompt eval time =       6.63 ms /   249 tokens (    0.03 ms per token, 37567.89 tokens per second)
0.00.700.291 I slot print_timing: id  0 | task 0 |        eval time =       3.27 ms /     8 tokens (    0.47 ms per token,  2138.06 tokens per second)
0.00.700.310 I slot print_timing: id  0 | task 0 |       total time =       9.90 ms /   257 tokens
0.00.700.329 I slot print_timing: id  0 | task 0 |    graphs reused =          7
0.00.700.381 I slot      release: id  0 | task 0 | stop processing: n_tokens = 256, truncated = 0
0.00.703.479 I slot launch_slot_: id  0 | task 10 | processing task, is_child = 0
0.00.703.482 I slot   operator(): id  0 | task 10 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 256
0.00.703.486 I slot   operator(): id  0 | task 10 | forcing full prompt re-processing due to lack of cache data (likely due to SWA or hybrid/recurrent memory, see https://github.com/ggml-org/llama.cpp/pull/13194#issuecomment-2868343055)
0.00.703.487 I slot   operator(): id  0 | task 10 | cached n_tokens = 0, memory_seq_rm [0, end)
0.00.706.220 I slot   operator(): id  0 | task 10 | cached n_tokens = 128, memory_seq_rm [128, end)
0.00.712.528 I slot print_timing: id  0 | task 10 | prompt eval time =       5.65 ms /   256 tokens (    0.02 ms per token, 45325.78 tokens per second)
0.00.712.533 I slot print_timing: id  0 | task 10 |        eval time =       3.39 ms /     8 tokens (    0.48 ms per token,  2064.29 tokens per second)
0.00.712.533 I slot print_timing: id  0 | task 10 |       total time =       9.04 ms /   264 tokens
0.00.712.534 I slot print_timing: id  0 | task 10 |    graphs reused =         13
0.00.712.564 I slot      release: id  0 | task 10 | stop processing: n_tokens = 263, truncated = 0
0.00.719.598 I slot launch_slot_: id  0 | task 20 | processing task, is_child = 0
0.00.719.606 I slot   operator(): id  0 | task 20 | new prompt, n_ctx_slot = 4096, n_keep = 0, task.n_tokens = 226
0.00.719.612 I slot   operator(): id  0 | task 20 | forcing full prompt re-processing due to lack of cache data (likely due to SWA or hybrid/recurrent memory, see https://github.com/ggml-org/llama.cpp/pull/13194#issuecomment-2868343055)
0.00.719.613 I slot   operator(): id  0 | task 20 | cached n_tokens = 0, memory_seq_rm [0, end)
0.00.722.917 I slot   operator(): id  0 | task 20 | cached n_tokens = 128, memory_seq_rm [128, end)
0.00.728.643 I slot print_timing: id  0 | task 20 | prompt eval time =       5.79 ms /   226 tokens (    0.03 ms per token, 39019.34 tokens per second)
0.00.728.690 I slot print_timing: id  0 | task 20 |        eval time =       3.24 ms /     8 tokens (    0.46 ms per token,  2161.16 tokens per second)
0.00.728.709 I slot print_timing: id  0 | task 20 |       total time =       9.03 ms /   234 tokens
0.00.728.728 I slot print_timing: id  0 | task 20 |    graphs reused =         19
0.00.728.981 I slot      release: id  0 | task 20 | stop processing: n_tokens = 233, truncated = 0
"""


def first_tokens_of(text: str = SWA_RUN) -> FirstTokens:
    """The first-token section of a one-run log."""
    (run,) = analyze(text.splitlines(keepends=True)).runs
    assert run.first_tokens is not None
    return run.first_tokens
