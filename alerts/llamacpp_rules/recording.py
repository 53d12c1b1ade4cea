"""The recording rules: per-server sums, what the requests in flight held, and the day's sizing figures."""

from __future__ import annotations

from llamacpp_rules.builder import ACTIVE, BUSY, HELD, LARGEST, PROMISED, SEEN, Rule, Rules

#: The granularity of the sizes the rules recommend (-c, --kv-unified-per-slot): llama-server rounds -c up to
#: a multiple of 256 cells.
ROUND = 256


def peak(window: str) -> str:
    """Recorded: the most the conversations in flight or coming back held together over ``window``."""
    return f"instance:llamacpp_kv_pool_active_tokens:max_{window}"


def typical(window: str) -> str:
    """Recorded: the median of what the conversations in flight or coming back held together over ``window``,
    the samples where they held nothing left out (nights, idle hours)."""
    return f"instance:llamacpp_kv_pool_active_tokens:median_busy_{window}"


def growth(window: str) -> str:
    """Recorded: the day-over-day growth of `typical` (0.1: 10 % more than ``window`` before; absent unless it
    grew)."""
    return f"instance:llamacpp_kv_pool_active_tokens:growth_{window}"


def full_in_days(window: str) -> str:
    """Recorded: in how many days `peak` reaches the pool at `growth` a day (absent: not growing)."""
    return f"instance:llamacpp_kv_pool_full_in_days:{window}"


#: Recorded: what the conversations in flight or coming back held together, where they held anything.
ACTIVE_BUSY = "instance:llamacpp_kv_pool_active_tokens:busy"


#: Recorded: KV cache bytes per cell (the size line's K and V over the pool's cells).
BYTES_PER_CELL = "instance:llamacpp_kv_cache_bytes_per_cell"


def choice(window: str) -> dict[str, str]:
    """Recorded: what would have held the most held together over ``window``, by option."""
    return {
        "context": f"instance:llamacpp_kv_pool_needed_context_tokens:max_{window}",
        "extra_bytes": f"instance:llamacpp_kv_pool_needed_extra_bytes:max_{window}",
        "slots": f"instance:llamacpp_slots_that_fit:max_{window}",
        "per_slot": f"instance:llamacpp_kv_per_slot_tokens:max_{window}",
        "per_slot_bytes": f"instance:llamacpp_kv_per_slot_bytes:max_{window}",
    }


def recording(r: Rules) -> list[Rule]:
    """Every recording rule, in the order of the rules file."""
    m, seen, w = r.m, SEEN, r.cfg.two_samples_window
    window = r.cfg.undersized_window
    tokens, processing = m("llamacpp_slot_tokens"), m("llamacpp_slot_processing")
    promised = m("llamacpp_kv_pool_demand_tokens", 'horizon="limits"')
    active, capacity, pick = m("llamacpp_kv_pool_active_tokens"), m("llamacpp_kv_pool_capacity_tokens"), choice(window)
    # A slot's cells while it processes, at two samples in a row (the lesser of the two; 0 unless it was
    # processing at both): one sample never counts, whatever the scrape and evaluation intervals.
    held_per_slot = (
        f"({tokens} - clamp_min(idelta({tokens}[{w}]), 0))\n"
        f"* ({processing} - idelta({processing}[{w}]))\n* {processing}"
    )

    def quantile(q: str, histogram: str) -> str:
        # One histogram per server: every label but `le` is kept, server and model included.
        return f"histogram_quantile({q}, rate({m(histogram + '_bucket')}[{window}]))"

    return [
        # What the requests in flight held together, and the largest of them (sizing; LlamaCppKVPoolUndersized).
        {"record": HELD, "expr": f"sum without (slot) (\n{held_per_slot}\n)"},
        {"record": LARGEST, "expr": f"max without (slot) (\n{held_per_slot}\n)"},
        {
            "record": PROMISED,
            "expr": f"sum without (horizon) ({promised} - clamp_min(idelta({promised}[{w}]), 0))",
        },
        {
            "record": f"instance:llamacpp_kv_pool_promised_tokens:max_{window}",
            "expr": f"max_over_time({PROMISED}[{window}])",
        },
        {
            "record": f"instance:llamacpp_request_in_flight_tokens:max_{window}",
            "expr": f"max_over_time({LARGEST}[{window}])",
        },
        # How many requests ran together at the busiest moments (p99 at each request's start), rounded up to
        # the whole number its bucket holds (concurrency is a whole number; the buckets are 1, 2, 3 ... 8).
        {
            "record": f"instance:llamacpp_request_concurrency:p99_{window}",
            "expr": f"ceil({quantile('0.99', 'llamacpp_request_concurrency')})",
        },
        # The pool the day's traffic needs: requests like its largest, as many at once as at its busiest
        # moments (exact at any scrape interval: the concurrency histogram counts every request's start). A
        # pool that aborts every request when it overflows is sized for the peak, not the median.
        {
            "record": f"instance:llamacpp_kv_pool_needed_tokens:{window}",
            "expr": (
                f"instance:llamacpp_request_in_flight_tokens:max_{window}\n"
                f"* clamp_min(instance:llamacpp_request_concurrency:p99_{window}, 1)"
            ),
        },
        # What the conversations in flight or coming back held together (the page and the capacity warning),
        # the lesser of two samples in a row, its peak over the window, and the growth of that peak day over day.
        {"record": ACTIVE, "expr": f"{active} - clamp_min(idelta({active}[{w}]), 0)"},
        {"record": peak(window), "expr": f"max_over_time({ACTIVE}[{window}])"},
        # The growth is read on the day's median, not its peak: the peak is a coincidence (how many long
        # conversations happened to run within a minute of each other), and two days' coincidences differ
        # by a third with nothing growing; the median of the busy samples moves when the conversations do.
        {"record": ACTIVE_BUSY, "expr": f"{ACTIVE} > 0"},
        {"record": typical(window), "expr": f"quantile_over_time(0.5, {ACTIVE_BUSY}[{window}])"},
        {
            "record": growth(window),
            "expr": f"({typical(window)} / ({typical(window)} offset {window}) - 1) > 0",
        },
        {
            "record": full_in_days(window),
            "expr": (
                f"clamp_min(ln({capacity} / {peak(window)}), 0)\n"
                f"/ ln(1 + {growth(window)})\n"
                f"and ({peak(window)} offset {window}) > {r.cfg.undersized_trend_min_ratio:g} * {capacity}"
            ),
        },
        # What would have held that peak: a larger -c (and its memory), fewer slots, or one window per slot.
        {"record": BYTES_PER_CELL, "expr": f"sum without (kind) ({m('llamacpp_kv_cache_bytes')}) / {capacity}"},
        {"record": pick["context"], "expr": f"ceil({peak(window)} / {ROUND}) * {ROUND}"},
        {
            "record": pick["extra_bytes"],
            "expr": f"({pick['context']} - {capacity}) * {BYTES_PER_CELL} > 0",
        },
        {
            "record": pick["slots"],
            "expr": f"floor({capacity} / clamp_min(instance:llamacpp_request_in_flight_tokens:max_{window}, 1))",
        },
        {
            "record": pick["per_slot"],
            "expr": f"ceil(instance:llamacpp_request_in_flight_tokens:max_{window} / {ROUND}) * {ROUND}",
        },
        {
            "record": pick["per_slot_bytes"],
            "expr": f"{pick['per_slot']} * {m('llamacpp_slots')} * {BYTES_PER_CELL}",
        },
        {
            "record": BUSY,
            "expr": f"sum without (slot) ({m('llamacpp_slot_processing')})",
        },
        {
            # Host RAM that llama-server holds for context checkpoints plus its prompt cache. A server
            # without checkpoint series (no slots yet) still gets its prompt cache counted.
            "record": "instance:llamacpp_host_cache_bytes:sum",
            "expr": (
                f"(sum without (slot) ({m('llamacpp_checkpoint_bytes')})"
                f" or {m('llamacpp_prompt_cache_bytes')} * 0)\n"
                f"+ {m('llamacpp_prompt_cache_bytes')}"
            ),
        },
        {
            # Per job: when a llamacpp-exporter of it was last scraped; kept (this rule reads its own
            # previous result) until exporter_forget_after has passed.
            "record": seen,
            "expr": (
                f"max by (job) (timestamp({m('llamacpp_exporter_build_info')}))\nor ({seen} > time() - {r.forget_s})"
            ),
        },
    ]
