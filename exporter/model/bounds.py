"""What a log line may say: the bounds of what a running llama-server can write. Pure.

The log is untrusted input (clients write request paths and, at debug levels, prompts into it). An
event past these bounds is rejected by `ServerState.apply`, counted in `rejected["out_of_range"]`,
and never applied. The bounds also bound the series: at most MAX_SLOTS slots.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exporter.logs import events as ev
from exporter.model.run import ServerRun

MIB = 1024 * 1024
MAX_SLOTS = 1024
MAX_TOKENS = 1 << 26  # 67M cells: far above any context llama.cpp supports
MAX_BYTES = float(1 << 44)  # 16 TiB: no host or GPU holds a bigger KV cache, checkpoint or prompt cache
MAX_CHECKPOINTS = 4096  # per slot
_MAX_MS = 1e10  # a request of 115 days
_MAX_MIB = MAX_BYTES / MIB


def _mib_ok(mib: float | None) -> bool:
    return mib is None or 0 <= mib <= _MAX_MIB


def _tokens_ok(run: ServerRun, slot: int, n: int) -> bool:
    """A slot id the run has and a token count its window can hold."""
    if slot >= (run.n_slots or MAX_SLOTS):
        return False
    s = run.slots.get(slot)
    return n <= ((s.n_ctx if s is not None else None) or run.n_ctx_slot or MAX_TOKENS)


# Bounds each event must keep before it is applied (see MAX_SLOTS …): slot ids the running server has,
# token counts its windows can hold, sizes a machine can have. Events not listed carry nothing to bound.
# Numbers come from `\d+` groups, so they are never negative; `n_slots` is never 0 (checked below), so
# `n_slots or MAX_SLOTS` is the slot bound. Plain comparisons: this runs for every event of the log.
CHECKS: dict[type[Any], Callable[[ServerRun, Any], bool]] = {
    ev.GenerationProgress: lambda run, e: e.slot < (run.n_slots or MAX_SLOTS) and e.n_decoded <= MAX_TOKENS,
    ev.PromptProgress: lambda run, e: _tokens_ok(run, e.slot, e.n_tokens),
    ev.CachedTokens: lambda run, e: _tokens_ok(run, e.slot, e.n_tokens),
    ev.SlotReleased: lambda run, e: _tokens_ok(run, e.slot, e.n_tokens),
    ev.SlotCleared: lambda run, e: e.slot < (run.n_slots or MAX_SLOTS) and e.n_tokens <= MAX_TOKENS,
    ev.SlotPurged: lambda run, e: e.slot < (run.n_slots or MAX_SLOTS) and e.n_tokens <= MAX_TOKENS,
    ev.TaskStarted: lambda run, e: e.slot < (run.n_slots or MAX_SLOTS),
    ev.NewPrompt: lambda run, e: (
        e.slot < (run.n_slots or MAX_SLOTS) and e.n_prompt_tokens <= e.n_ctx_slot <= MAX_TOKENS
    ),
    ev.KVRetry: lambda run, e: e.offset <= MAX_TOKENS and e.n_batch <= MAX_TOKENS,
    ev.MemorySlotFailure: lambda run, e: e.batch_size <= MAX_TOKENS,
    ev.PromptEvalTiming: lambda run, e: e.ms <= _MAX_MS and e.tokens <= MAX_TOKENS and e.slot < MAX_SLOTS,
    ev.GenerationTiming: lambda run, e: e.ms <= _MAX_MS and e.tokens <= MAX_TOKENS and e.slot < MAX_SLOTS,
    ev.DraftAcceptance: lambda run, e: e.accepted <= e.generated <= MAX_TOKENS and e.slot < MAX_SLOTS,
    ev.GenerationStopped: lambda run, e: e.slot < (run.n_slots or MAX_SLOTS),
    # A total counts prompt and generated tokens, and its time is theirs together.
    ev.TotalTiming: lambda run, e: e.ms <= 2 * _MAX_MS and e.tokens <= 2 * MAX_TOKENS and e.slot < MAX_SLOTS,
    ev.CheckpointConfig: lambda run, e: e.max_per_slot <= MAX_CHECKPOINTS,
    ev.CheckpointCreated: lambda run, e: (
        e.slot < (run.n_slots or MAX_SLOTS)
        and e.index <= MAX_CHECKPOINTS
        and e.max_per_slot <= MAX_CHECKPOINTS
        and e.size_mib <= _MAX_MIB
    ),
    ev.CheckpointRemoved: lambda run, e: e.slot < (run.n_slots or MAX_SLOTS) and e.size_mib <= _MAX_MIB,
    ev.CheckpointSuperseded: lambda run, e: e.slot < (run.n_slots or MAX_SLOTS),
    ev.CheckpointRestored: lambda run, e: e.slot < (run.n_slots or MAX_SLOTS),
    ev.CheckpointRestoreFailed: lambda run, e: e.slot < (run.n_slots or MAX_SLOTS),
    ev.FullReprocess: lambda run, e: e.slot < (run.n_slots or MAX_SLOTS),
    ev.PromptCacheLimit: lambda run, e: _mib_ok(e.limit_mib),
    ev.PromptCacheState: lambda run, e: e.prompts <= MAX_TOKENS and e.size_mib <= _MAX_MIB and e.limit_mib <= _MAX_MIB,
    ev.PromptSaved: lambda run, e: e.length <= MAX_TOKENS and e.size_mib <= _MAX_MIB,
    ev.PromptCacheCandidate: lambda run, e: e.length <= MAX_TOKENS,
    ev.SlotSelected: lambda run, e: e.slot < (run.n_slots or MAX_SLOTS),
    ev.IdleSlotSaved: lambda run, e: e.slot < (run.n_slots or MAX_SLOTS),
    ev.SlotsInitialized: lambda run, e: 1 <= e.n_slots <= MAX_SLOTS and (e.n_ctx_slot or 0) <= MAX_TOKENS,
    ev.SlotCreated: lambda run, e: e.slot < (run.n_slots or MAX_SLOTS) and e.n_ctx <= MAX_TOKENS,
    ev.ContextParam: lambda run, e: e.value <= MAX_TOKENS,
    ev.KVCacheSection: lambda run, e: e.cells <= MAX_TOKENS,
    ev.RecurrentMemory: lambda run, e: e.cells <= MAX_TOKENS,
    ev.KVCacheSize: lambda run, e: (
        (e.cells or 0) <= MAX_TOKENS
        and (e.seqs or 0) <= MAX_SLOTS
        and (e.streams or 0) <= MAX_SLOTS
        and e.size_mib <= _MAX_MIB
        and e.k_mib <= _MAX_MIB
        and e.v_mib <= _MAX_MIB
    ),
    ev.PerSlotCap: lambda run, e: e.requested <= MAX_TOKENS and e.cap <= MAX_TOKENS,
}
# Every kind that names a slot is bounded by the slots the run has, whether or not it is listed above: a new
# slot-carrying kind cannot be applied unbounded.
CHECKS.update(
    {kind: lambda run, e: e.slot < (run.n_slots or MAX_SLOTS) for kind in ev.SLOT_KINDS if kind not in CHECKS}
)
