"""A three-slot sudden overflow as llama-server b11434 writes it at its default verbosity (no `new
prompt` or progress lines): three requests started back to back, 70,000 + 45,000 + 16,500 = 131,500
tokens in a unified pool of 131,072 cells, aborted together at 56.8 s.

Every line is a line of the real capture tests/fixtures/b11434/exhaust-default-verbosity (same wording,
levels and layout), with its numbers changed: the slots, the pool, the task ids, the tokens and the times.
An earlier request at 22.3 s is the run's first point, so a chart whose time started there (34.5 s
before the failure) instead of at the server's start would put its marker elsewhere than the text.
"""

from __future__ import annotations

POOL = 131_072
AT_ABORT = {0: 70_000, 1: 45_000, 2: 16_500}  # slot -> its release line's n_tokens
TASKS = {0: 10, 1: 12, 2: 14}
FAILURE_S = 56.8
OVERFLOW = sum(AT_ABORT.values()) - POOL  # 428: the batch that found no room


def _stamp(seconds: float) -> str:
    us = round(seconds * 1e6)
    m, us = divmod(us, 60_000_000)
    s, us = divmod(us, 1_000_000)
    ms, us = divmod(us, 1000)
    return f"{m}.{s:02d}.{ms:03d}.{us:03d}"


def sudden_overflow_lines() -> list[str]:
    out: list[str] = []
    t = 0.0

    def log(level: str, msg: str, at: float | None = None) -> None:
        nonlocal t
        t = at if at is not None else t + 0.000_013
        out.append(f"{_stamp(t)} {level} {msg}\n")

    def slot(s: int, task: int, func: str, msg: str) -> str:
        return f"slot {func:>12}: id {s:2d} | task {task} | {msg}"

    log("I", "srv  llama_server: initializing ...", 0.003_560)
    log("I", "cmn  common_param: common_params_print_info: verbosity = 3 (adjust with the `-lv N` CLI arg)")
    log("I", "srv    load_model: loading model 'models/model.gguf'", 0.006_578)
    log("I", "cmn          init: llama threadpool init, n_threads = 2")
    log("I", f"srv    load_model: initializing, n_slots = 3, n_ctx_slot = {POOL}, kv_unified = 'true'", 2.5)
    log("I", "srv  llama_server: model loaded")
    log("I", "srv  llama_server: listening on http://127.0.0.1:8080")
    # A short request first (the run's first chart point), then the three that die together.
    log("I", slot(2, -1, "get_availabl", "selected slot by LRU, t_last = -1"), 22.3)
    log("I", slot(2, 2, "launch_slot_", "processing task, is_child = 0"))
    log(
        "I",
        slot(
            2,
            2,
            "print_timing",
            "prompt eval time =       3.30 ms /    34 tokens (    0.10 ms per token, 10296.79 tokens per second)",
        ),
    )
    log("I", slot(2, 2, "print_timing", "       total time =       5.66 ms /    50 tokens"))
    log("I", slot(2, 2, "release", "stop processing: n_tokens = 49, truncated = 0"), 22.31)
    for s in (0, 1, 2):
        log("I", slot(s, -1, "get_availabl", "selected slot by LRU, t_last = -1"), 30.0 + s * 0.01)
        log("I", slot(s, TASKS[s], "launch_slot_", "processing task, is_child = 0"))
    # The cascade: the 428-token batch halves down to 1 and still finds no room.
    off, size, n_batch = 2048 - OVERFLOW, OVERFLOW, 2048
    log("W", f"decode: failed to find a memory slot for batch of size {size}", FAILURE_S - 0.01)
    while n_batch > 1:
        n_batch //= 2
        log(
            "W",
            "srv        decode: failed to find free space in the KV cache, retrying with smaller batch size, "
            f"off = {off}, n_batch = {n_batch}, ret = 1",
        )
        log("W", f"decode: failed to find a memory slot for batch of size {min(n_batch, size)}")
    log("E", f"srv        decode: Context size has been exceeded. off = {off}, n_batch = 1, ret = 1", FAILURE_S)
    for s in (0, 1, 2):
        task = TASKS[s]
        log("E", f"srv    send_error: task id = {task}, error: Context size has been exceeded.")
        log("W", f"srv          stop: cancel task, id_task = {task}")
        log("I", slot(s, task, "release", f"stop processing: n_tokens = {AT_ABORT[s]}, truncated = 0"))
    log("E", "srv  update_slots: decode() failed: Context size has been exceeded.")
    log("I", "srv    operator(): operator(): cleaning up before exit...", FAILURE_S + 3.0)
    return out
