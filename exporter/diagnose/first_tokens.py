"""A run's first tokens by cache outcome, and why whole prompts were re-processed: the split the exporter's
`llamacpp_time_to_first_token_seconds{cache=…}` gives, per run.

Each `prompt eval time` line is labelled where the exporter labels it (`exporter.model.handlers`, with
`exporter.model.latency.cache_outcome`, the one rule); the counts and sums here are that histogram's, the
quantiles the nearest rank over the printed figures (exact up to 4,096 distinct times an outcome, then to 4
significant digits), and the maximum exact (`ExactValues.first_token`, kept by the same handler).
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.diagnose.advice import reprocess_advice
from exporter.diagnose.report import FirstTokenOutcome, FirstTokens
from exporter.model.bounds import MIB
from exporter.model.latency import CACHE_OUTCOMES
from exporter.model.request_sizes import exact_quantile
from exporter.model.state import ServerState

#: How the text names the model's memory (`FirstTokens.model_memory`).
MEMORY_WORDS = {
    "sliding_window": "a sliding-window attention (SWA) model",
    "hybrid": "a hybrid model (attention and recurrent layers)",
    "recurrent": "a recurrent model",
}


@dataclass
class MemoryKind:
    """What a run's start-up lines said of the model's memory (its KV cache's sections, a recurrent state)."""

    swa_cells: int | None = None  # `creating     SWA KV cache, size = N cells`
    full_cells: int | None = None  # `creating non-SWA KV cache, size = N cells`
    recurrent: bool = False  # `llama_memory_recurrent: size = …`
    attention: bool = False  # a `llama_kv_cache: size = …` line (with a recurrent state: hybrid)

    def kind(self) -> str | None:
        if self.recurrent:
            return "hybrid" if self.attention else "recurrent"
        return "sliding_window" if self.swa_cells is not None else None


def first_tokens(st: ServerState, memory: MemoryKind) -> FirstTokens | None:
    """The run's first tokens by cache outcome (None: no `prompt eval time` line)."""
    exact = st.request_values
    values = exact.first_token_ms if exact is not None else {}
    largest = exact.first_token_max_ms if exact is not None else {}
    outcomes: list[FirstTokenOutcome] = []
    for cache in CACHE_OUTCOMES:
        h = st.latency.ttft[cache]
        if not h.count:
            continue
        ms = sorted(values.get(cache, {}).items())
        p50, p95 = exact_quantile(ms, 0.5), exact_quantile(ms, 0.95)
        assert p50 is not None and p95 is not None  # the handler keeps a value for every observation
        top = largest.get(cache, ms[-1][0])
        p50, p95 = min(p50, top), min(p95, top)  # a key rounded up past the largest value is that value
        how = "4_significant_digits" if exact is not None and cache in exact.first_token_rounded else "exact"
        outcomes.append(FirstTokenOutcome(cache, h.count, h.sum, p50 / 1000.0, p95 / 1000.0, top / 1000.0, how))
    if not outcomes:
        return None
    total = sum(o.seconds for o in outcomes)
    full = sum(o.seconds for o in outcomes if o.cache == "full_reprocess")
    limit = st.run.prompt_cache_limit_bytes
    ft = FirstTokens(
        outcomes=outcomes,
        seconds=total,
        full_reprocess_share=full / total if total > 0 else 0.0,
        model_memory=memory.kind(),
        swa_cells=memory.swa_cells,
        full_cells=memory.full_cells,
        full_reprocess_lines=st.full_reprocess,
        checkpoints_invalidated=st.checkpoint_events["invalidated"],
        checkpoints_evicted=st.checkpoint_events["evicted"],
        checkpoints_restored=st.checkpoint_events["restored"],
        checkpoint_limit=st.run.checkpoint_limit,
        prompt_cache_enabled=None if limit is None else limit > 0,
        prompt_cache_limit_mib=None if limit is None or limit in (0.0, float("inf")) else limit / MIB,
    )
    ft.advice = reprocess_advice(ft)
    return ft


def _s(seconds: float) -> str:
    return f"{seconds:,.3f}"


def first_token_table(ft: FirstTokens) -> list[list[str]]:
    """The header and a row per cache outcome: requests, total, p50, p95 and max seconds."""
    rows = [[o.cache, f"{o.requests:,}", _s(o.seconds), _s(o.p50_s), _s(o.p95_s), _s(o.max_s)] for o in ft.outcomes]
    return [_HEADER, *rows]


def first_token_prose(ft: FirstTokens) -> list[str]:
    """The share of full re-processing, the model's memory, and why (`advice.reprocess_advice`)."""
    requests = sum(o.requests for o in ft.outcomes)
    full = next((o for o in ft.outcomes if o.cache == "full_reprocess"), None)
    reprocessed = f"{full.requests:,} of {requests:,} requests" if full else f"none of {requests:,} requests"
    out = [
        f"Of the {_s(ft.seconds)} s spent on first tokens, {ft.full_reprocess_share * 100:.1f} % was full "
        f"re-processing ({reprocessed})."
    ]
    if ft.model_memory is not None:
        what = MEMORY_WORDS[ft.model_memory]
        if ft.model_memory == "sliding_window" and ft.swa_cells is not None:
            of = f" (the full-attention cache {ft.full_cells:,})" if ft.full_cells is not None else ""
            what += f": its SWA cache holds {ft.swa_cells:,} cells{of}"
        out.append(f"The model is {what}.")
    out.extend(ft.advice)
    return out


def first_token_lines(ft: FirstTokens) -> list[str]:
    """The run's `First tokens` section for the text: the table, then the prose."""
    table = first_token_table(ft)
    widths = [max(len(r[i]) for r in table) for i in range(len(_HEADER))]
    out = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in table
    ]
    return out + first_token_prose(ft)


_HEADER = ["cache", "requests", "total s", "p50 s", "p95 s", "max s"]
