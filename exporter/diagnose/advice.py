"""What to change, from a run's configuration and counts: each fix with its memory cost."""

from __future__ import annotations

from collections.abc import Sequence

from exporter.diagnose.report import (
    Configuration,
    Counts,
    FirstTokens,
    MemoryCost,
    PoolSizing,
    Recommendation,
    RunSummary,
)
from exporter.diagnose.sizing import config_of

# Bytes per element of the GGML cache types llama-server accepts for -ctk/-ctv.
_TYPE_BYTES: dict[str, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}
# `--kv-unified-per-slot` landed after b9928 (PR #24124; the exact build is not verified).
_PER_SLOT_FLAG_AFTER = 9928


#: Every piece of advice `diagnose` gives, the setting that must not already be in effect for it to be
#: given, and the log's evidence of that setting (docs/diagnose.md's table; a test keeps the two equal).
RULES: tuple[tuple[str, str, str], ...] = (
    (
        "raise the pool (-c) to the recommended size",
        "the pool overflowed, or the requests' p99 x p99 exceeds it",
        "the failures' release lines; every request's release line and start",
    ),
    (
        "a q8_0 cache (-ctk q8_0 -ctv q8_0)",
        "K or V is larger than q8_0 (f32, f16, bf16)",
        "the `llama_kv_cache: size` line's K and V types",
    ),
    (
        "--kv-unified-per-slot N",
        "one unified pool (-kvu) with more than one slot, not already capped per slot",
        "the pool line (`n_seq_max`, `kv_unified`); the `--kv-unified-per-slot` capping line",
    ),
    (
        "drop -kvu (--no-kv-unified)",
        "one unified pool (-kvu) with more than one slot",
        "the pool line (`kv_unified = true`)",
    ),
    ("serve fewer requests at once (-np)", "more than one slot", "the slots line (`n_slots`)"),
    (
        "keep the whole sliding window (--swa-full)",
        "a sliding-window model re-processed prompts whole, its SWA cache smaller than the full-attention one",
        "`forcing full prompt re-processing` lines; the `creating SWA KV cache` and `non-SWA KV cache` lines",
    ),
    (
        "more context checkpoints (--ctx-checkpoints N)",
        "a sliding-window, hybrid or recurrent model re-processed prompts whole, and checkpoints were disabled "
        "or old ones erased to make room",
        "`forcing full prompt re-processing`; `context checkpoints disabled` / `enabled, max = N`; "
        "`erasing old context checkpoint`",
    ),
    (
        "a host-memory prompt cache (--cache-ram N)",
        "a sliding-window, hybrid or recurrent model re-processed prompts whole, and the prompt cache is disabled",
        "`forcing full prompt re-processing`; `prompt cache is disabled`",
    ),
)


def quantized(type_k: str | None, type_v: str | None) -> bool | None:
    """Both caches are already q8_0 or smaller (None: the log does not say)."""
    if type_k not in _TYPE_BYTES or type_v not in _TYPE_BYTES:
        return None
    return max(_TYPE_BYTES[type_k], _TYPE_BYTES[type_v]) <= _TYPE_BYTES["q8_0"]


def _convert(bytes_per_cell: float, from_type: str | None, to_type: str) -> float | None:
    """Bytes per cell of a K or V cache in another type (same elements per cell)."""
    if from_type is None or from_type not in _TYPE_BYTES:
        return None
    return bytes_per_cell / _TYPE_BYTES[from_type] * _TYPE_BYTES[to_type]


def memory_costs(c: Configuration, pool_cells: int) -> list[MemoryCost]:
    """KV memory of a pool of `pool_cells` at the current types and at q8_0, from the measured bytes per cell."""
    if c.k_bytes_per_cell is None or c.v_bytes_per_cell is None or c.type_k is None or c.type_v is None:
        return []
    current = c.kv_bytes or 0
    costs = [
        MemoryCost(
            c.type_k,
            c.type_v,
            "",
            round((c.k_bytes_per_cell + c.v_bytes_per_cell) * pool_cells + (c.swa_kv_bytes or 0)),
            0,
        )
    ]
    k8, v8 = _convert(c.k_bytes_per_cell, c.type_k, "q8_0"), _convert(c.v_bytes_per_cell, c.type_v, "q8_0")
    if quantized(c.type_k, c.type_v) is False and k8 is not None and v8 is not None:
        swa = c.swa_kv_bytes or 0
        if swa:
            swa_rate = (_TYPE_BYTES["q8_0"] * 2) / (_TYPE_BYTES[c.type_k] + _TYPE_BYTES[c.type_v])
            swa = round(swa * swa_rate)
        costs.append(MemoryCost("q8_0", "q8_0", "-ctk q8_0 -ctv q8_0", round((k8 + v8) * pool_cells + swa), 0))
    for m in costs:
        delta = m.kv_bytes - current
        m.delta_bytes = 0 if abs(delta) < 1024 else delta  # the same size, up to the size line's rounding
    return costs


def advise(c: Configuration, n: Counts) -> tuple[list[Recommendation], str | None, list[str]]:
    """Recommendations with numbers from this run, which one the log supports, and what it cannot know."""
    if not (c.n_slots and c.n_ctx_slot and c.pool_cells and c.overcommit is not None):
        return [], None, []
    if c.kv_unified is not True or c.overcommit <= 1.0 or c.n_slots < 2 or c.per_slot_cap is not None:
        return [], None, []
    n_slots, window, pool = c.n_slots, c.n_ctx_slot, c.pool_cells
    guaranteed_pool = n_slots * window
    share = pool // n_slots
    largest = n.largest_request_tokens
    needs_newer = c.build is not None and c.build <= _PER_SLOT_FLAG_AFTER
    per_slot = Recommendation(
        kind="kv_unified_per_slot",
        flags=f"--kv-unified-per-slot {window}",
        pool_cells=guaranteed_pool,
        window_per_slot=window,
        memory=memory_costs(c, guaranteed_pool),
        requests_over_window=0,
        supported_by_log=False,
        summary=(
            f"keep -np {n_slots} -kvu, add --kv-unified-per-slot {window} and drop -c (or set -c {guaranteed_pool}): "
            f"the pool grows to {n_slots} x {window:,} = {guaranteed_pool:,} cells, so every slot keeps its "
            f"{window:,}-token window and no request can abort another"
            + (f" (needs a llama-server newer than b{_PER_SLOT_FLAG_AFTER}; this is b{c.build})" if needs_newer else "")
        ),
    )
    private = Recommendation(
        kind="no_kv_unified",
        flags=f"-np {n_slots} -c {pool} --no-kv-unified",
        pool_cells=pool,
        window_per_slot=share,
        memory=memory_costs(c, pool)[:1],
        requests_over_window=n.requests_over_equal_share,
        supported_by_log=False,
        summary=(
            f"drop -kvu (run -np {n_slots} -c {pool} --no-kv-unified): the same {pool:,} cells split into "
            f"{n_slots} private pools of {share:,} cells; no extra memory, but each slot's window shrinks from "
            f"{window:,} to {share:,} tokens: a longer request is cut or refused (HTTP 400) instead of aborting "
            "the others" + (" (llama.cpp may round the per-slot size to a multiple of 256)" if share % 256 else "")
        ),
    )
    over = n.requests_over_equal_share
    failed = n.aborted_requests or n.aborts or n.retries or n.memory_slot_failures or n.cascades_failed
    if not failed:
        # Nothing failed: a change is worth its cost only if this log's own requests could not run together.
        if not largest or largest * n_slots <= pool:
            return [], None, []
        cheaper_first = [private, per_slot]
        (private if largest <= share else per_slot).supported_by_log = True
        verdict = (
            f"No request failed in this log, but the pool is a risk: requests here held up to {largest:,} tokens, "
            f"and {n_slots} of them at once need {largest * n_slots:,} cells of the {pool:,} the slots share; "
            "then llama-server aborts every request in flight. Each fix has a cost: the first shrinks the "
            "windows, the second takes more KV memory."
        )
        return cheaper_first, verdict, [*_UNKNOWNS] if c.kv_bytes_per_cell is not None else [_HIDDEN_SIZE, *_UNKNOWNS]
    if not largest:
        verdict = (
            "No request finished in this log, so it cannot tell which windows the clients need: "
            f"--kv-unified-per-slot {window} keeps today's windows."
        )
    elif largest <= share:
        private.supported_by_log = True
        verdict = (
            f"The log supports dropping -kvu: its largest request held {largest:,} tokens, within the {share:,} "
            f"cells each slot would get, so the fix costs no memory. --kv-unified-per-slot {window} also works "
            "but buys windows no request in this log used."
        )
    else:
        per_slot.supported_by_log = True
        over_text = f"{over:,} of {n.requests_finished:,} requests" if over is not None else "some requests"
        verdict = (
            f"The log supports --kv-unified-per-slot {window}: requests here held up to {largest:,} tokens, and "
            f"{over_text} held more than the {share:,} tokens a private slot would get without -kvu."
        )
    unknowns = [*_UNKNOWNS] if c.kv_bytes_per_cell is not None else [_HIDDEN_SIZE, *_UNKNOWNS]
    return [per_slot, private], verdict, unknowns


_UNKNOWNS = [
    "free GPU and host memory: the log does not show whether the larger KV cache fits "
    "(check llamacpp_gpu_memory_free_bytes or nvidia-smi before restarting)",
    "compute buffers and other per-context memory also grow with the pool; the figures above are the KV "
    "cache alone (from the size line), so measure after the change",
    "future requests: the windows above are sized from this log's requests",
]
_HIDDEN_SIZE = "KV memory: the `llama_kv_cache: size` line is hidden at this verbosity (run with -lv 4)"


#: Less than this much memory left at start (MiB, and a share of what there was) is little: llama.cpp's
#: own --fit keeps 1,024 MiB free on each device by default.
_LITTLE_HEADROOM_MIB = 1024
_LITTLE_HEADROOM_SHARE = 0.05


def _little(runs: Sequence[RunSummary]) -> bool | None:
    """Whether these runs started with little memory to spare; None when no log said."""
    known = [r.memory for r in runs if r.memory is not None]
    if not known:
        return None
    return any(m.headroom_mib < max(_LITTLE_HEADROOM_MIB, m.available_mib * _LITTLE_HEADROOM_SHARE) for m in known)


def history_advice(runs: Sequence[RunSummary], requests: object = None, sizing: PoolSizing | None = None) -> list[str]:
    """What the whole history points at: a pool too small for the requests it served, and crashes."""
    return pool_advice(sizing, config_of(runs, sizing)) + _crash_advice(runs)


def pool_advice(sizing: PoolSizing | None, c: Configuration | None) -> list[str]:
    """What to change when the pool was too small: the recommended size first, then each other fix whose
    setting is not already in effect (RULES).

    >>> from exporter.diagnose.report import PoolSizing
    >>> z = PoolSizing("too_small", 131072, True, 131500, 1, 9, 428, 210000, 393216, 210000, "p99_x_p99",
    ...                "q8_0", "q8_0", 136.0, 28560000, 17825792)
    >>> (text,) = pool_advice(z, None)
    >>> text
    'Raise the pool to 210,000 cells (-c 210000).'
    """
    if sizing is None or sizing.verdict != "too_small" or sizing.recommended is None:
        return []
    rec = sizing.recommended
    parts = [f"Raise the pool to {rec:,} cells (-c {rec})"]
    if quantized(sizing.type_k, sizing.type_v) is False:
        parts.append(
            f"make it cheaper with a q8_0 cache (-ctk q8_0 -ctv q8_0; now K {sizing.type_k}, V {sizing.type_v}), "
            "about half of f16's memory"
        )
    slots = c.n_slots if c is not None and c.n_slots else 0
    if slots > 1:
        parts.append(f"serve fewer requests at once (now -np {slots})")
    if slots > 1 and c is not None and c.kv_unified is True and c.per_slot_cap is None and c.n_ctx_slot:
        parts.append(
            f"give each slot its own window (--kv-unified-per-slot {c.n_ctx_slot}: "
            f"{slots * c.n_ctx_slot:,} cells) so that no request can abort the others"
        )
    text = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + ", or " + parts[-1]
    return [text + "."]


def _crash_advice(runs: Sequence[RunSummary]) -> list[str]:
    """Crashes that line up with long prompts (and little memory) point at memory headroom (-c, -ub, a
    q8_0 cache), not at the shared pool.

    A prompt is long when it is at least half its slot's window, or longer than any request a run that
    did not crash finished. Only runs that stopped mid-request without their exit line (crashed or
    killed, then started again) count as crashes.
    """
    crashes = [r for r in runs if r.ending == "died_mid_request"]
    if not crashes:
        return []
    finished = max((r.largest_request_tokens for r in runs if r.ending != "died_mid_request"), default=0)

    def long(r: RunSummary) -> bool:
        p = r.in_flight_prompt_tokens or 0
        return bool(p) and ((r.n_ctx_slot is not None and 2 * p >= r.n_ctx_slot) or (finished > 0 and p > finished))

    at_long = [r for r in crashes if long(r)]
    if not at_long or 2 * len(at_long) < len(crashes):
        return []
    sizes = sorted(r.in_flight_prompt_tokens or 0 for r in at_long)
    span = f"{sizes[0]:,}" if sizes[0] == sizes[-1] else f"{sizes[0]:,}-{sizes[-1]:,}"
    head = (
        f"{len(at_long)} of {len(crashes)} crash{'es' if len(crashes) > 1 else ''} came while a long prompt "
        f"({span} tokens) was being processed"
    )
    overflowed = any(r.failures for r in at_long)
    pool = (
        " Those runs also overflowed the KV pool (see each run), but an overflow does not crash the server "
        "(llama-server aborts the requests in flight and goes on): this points at memory headroom as well"
        if overflowed
        else " The pool did not overflow in those runs: this points at memory headroom, not at the KV pool"
    )
    configs = [r.configuration for r in at_long if r.configuration is not None]
    if configs and all(quantized(x.type_k, x.type_v) for x in configs):  # already q8_0 or smaller
        fix = (
            "make room for the compute buffers a long prompt needs with a smaller -c or a smaller -ub (the "
            "compute buffer grows with it)"
        )
    else:
        fix = (
            "make room for the compute buffers a long prompt needs with a smaller -c, a smaller -ub (the "
            "compute buffer grows with it), or a q8_0 KV cache (-ctk q8_0 -ctv q8_0, half of f16's size)"
        )
    little = _little(at_long)
    if little is None:
        return [
            f"{head}. If memory was short, this points at memory headroom"
            + (" as well as the KV pool" if overflowed else " rather than the KV pool")
            + f": {fix}. The logs do not say how much was free: llama-server prints it at -lv 4 "
            "(`projected to use … MiB of device memory vs. … MiB of free device memory`), and "
            "llamacpp_gpu_memory_free_bytes shows it live."
        ]
    if not little:
        return []
    left = min((r.memory for r in at_long if r.memory is not None), key=lambda m: m.headroom_mib)
    assert left is not None
    where = "device" if left.kind == "device" else "host"
    if left.headroom_mib >= 0:
        short = (
            f"with as little as {left.headroom_mib:,} MiB of {where} memory left at start "
            f"(of {left.available_mib:,} MiB)"
        )
    else:
        short = (
            f"projected at start to need {-left.headroom_mib:,} MiB more {where} memory "
            f"than the {left.available_mib:,} MiB there was"
        )
    return [f"{head}, {short}.{pool}: {fix}."]


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n:,} times"


def reprocess_advice(ft: FirstTokens) -> list[str]:
    """Why a sliding-window, hybrid or recurrent model's prompts were re-processed whole, and each fix whose
    setting is not already in effect (RULES): --swa-full, --ctx-checkpoints, --cache-ram."""
    if not ft.full_reprocess_lines:
        return []
    if ft.model_memory == "sliding_window":
        why = (
            "its SWA cache keeps only the last tokens of the window, so a prompt that returns to a point the window "
            "has rolled past finds those cells overwritten"
        )
    elif ft.model_memory is not None:
        why = "its recurrent state cannot be rolled back to an earlier token"
    else:  # llama-server says so only of these models; the start-up lines that would say which are not in the log
        why = (
            "the model's cache could not be cut back to where the prompt returned (llama-server does this only "
            "for sliding-window and hybrid or recurrent models; the log does not say which this is)"
        )
    invalidated = ft.checkpoints_invalidated
    gone = (
        f"; {invalidated:,} context checkpoint{'s were' if invalidated != 1 else ' was'} invalidated "
        "(`erased invalidated context checkpoint`)"
        if invalidated
        else ""
    )
    out = [
        f"llama-server re-processed a whole prompt {_times(ft.full_reprocess_lines)} "
        f"(`forcing full prompt re-processing`): {why}, and no context checkpoint covered it{gone}."
    ]
    fixes: list[str] = []
    swa, full = ft.swa_cells, ft.full_cells
    if ft.model_memory == "sliding_window" and swa is not None and full is not None and swa < full:
        fixes.append(
            f"--swa-full keeps the whole window ({full:,} SWA cells instead of {swa:,}, more KV memory), "
            "so any point of the conversation can be reused"
        )
    if ft.checkpoint_limit == 0:
        fixes.append("--ctx-checkpoints N turns context checkpoints on (they are disabled)")
    elif ft.checkpoints_evicted:
        limit = f" than {ft.checkpoint_limit:,} per slot" if ft.checkpoint_limit is not None else ""
        fixes.append(
            f"--ctx-checkpoints N keeps more checkpoints{limit} ({ft.checkpoints_evicted:,} were erased to make room)"
        )
    if ft.prompt_cache_enabled is False:
        fixes.append("--cache-ram N keeps earlier prompts in host memory (the prompt cache is disabled)")
    if fixes:
        out.append("What helps: " + "; ".join(fixes) + ".")
    return out
