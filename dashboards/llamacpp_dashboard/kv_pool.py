"""The KV pool's rows: the forecast (used vs demand vs capacity, demand per slot), then the pool itself
(tokens per slot, usage, retries and aborts, overcommit, slots processing)."""

from __future__ import annotations

from llamacpp_dashboard.clients import who_holds_the_pool
from llamacpp_dashboard.layout import Layout
from llamacpp_dashboard.panels import (
    BLUE,
    BUSY_MAP,
    GREEN,
    KV_SATURATED_RATIO,
    ORANGE,
    RED,
    Panel,
    capacity_line,
    per_instance,
    state_timeline,
    thresholds,
    timeseries,
)
from llamacpp_dashboard.query import OF_MODEL, q


def kv_pool_forecast(lay: Layout) -> None:
    """The row "KV pool forecast"."""
    lay.row("KV pool forecast")
    lay.add(_used_vs_demand(), 14, 8)
    lay.add(_demand_per_slot(), 10, 8)


def kv_pool(lay: Layout) -> None:
    """The row "KV pool"."""
    lay.row("KV pool")
    lay.add(_tokens_per_slot(), 9, 9)
    lay.add(who_holds_the_pool(), 9, 9)  # beside the slots: whose requests fill them
    lay.add(_usage(), 6, 9)
    lay.add(_events(), 12, 8)
    lay.add(_overcommit(), 6, 8)
    lay.add(_slots_processing(), 6, 8)


def _used_vs_demand() -> Panel:
    return timeseries(
        "KV pool: used vs demand vs capacity" + OF_MODEL,
        'llamacpp_kv_pool_used_tokens (cells held now), llamacpp_kv_pool_demand_tokens{horizon="prompt"} '
        "(what the requests in flight hold once their prompts are read: above the capacity the abort is "
        "certain unless a request ends first, and LlamaCppKVPoolOverflowAhead pages), "
        'llamacpp_kv_pool_demand_tokens{horizon="limits"} (plus the generation budgets their clients set: '
        'LlamaCppKVPoolOverflowPossible), llamacpp_kv_pool_demand_tokens{horizon="max"} (at most: a request '
        "without a limit counts its whole window) and llamacpp_kv_pool_capacity_tokens (red line).",
        [
            q("llamacpp_kv_pool_used_tokens{S}", "{W} used", "A"),
            q('llamacpp_kv_pool_demand_tokens{S, horizon="prompt"}', "{W} demand (prompts)", "B"),
            q('llamacpp_kv_pool_demand_tokens{S, horizon="limits"}', "{W} demand (at their limits)", "E"),
            q('llamacpp_kv_pool_demand_tokens{S, horizon="max"}', "{W} demand (at most)", "C"),
            q("llamacpp_kv_pool_capacity_tokens{S}", "{W} capacity", "D"),
        ],
        unit="short",
        axis_label="tokens (KV cells)",
        overrides=[
            capacity_line("D"),
            {
                "matcher": {"id": "byFrameRefID", "options": "C"},
                "properties": [
                    {"id": "custom.fillOpacity", "value": 0},
                    {"id": "custom.lineStyle", "value": {"dash": [2, 4], "fill": "dot"}},
                ],
            },
        ],
    )


def _demand_per_slot() -> Panel:
    return per_instance(
        timeseries(
            "Demand per slot" + OF_MODEL,
            'llamacpp_slot_demand_tokens{horizon="prompt"}: the cells each request in flight will hold once its '
            "prompt is read (0 for an idle slot). The largest band is the request to cancel when the pool "
            "would overflow. llamacpp_kv_pool_demand_slots says how the sizes are known (new_prompt at -lv 4, "
            "progress lines, or held: not known yet).",
            [q('llamacpp_slot_demand_tokens{S, horizon="prompt"}', "{W} slot {{slot}}")],
            unit="short",
            stack=True,
            axis_label="tokens (KV cells)",
        )
    )


def _tokens_per_slot() -> Panel:
    return per_instance(
        timeseries(
            "KV pool: tokens per slot vs capacity" + OF_MODEL,
            "llamacpp_slot_tokens (stacked, one band per slot: KV cells each slot holds, idle slots keep theirs "
            "until cleared) against llamacpp_kv_pool_capacity_tokens (red line). When the stack reaches the "
            "line, llama-server runs the retry cascade and aborts every in-flight request.",
            [
                q("llamacpp_slot_tokens{S}", "{W} slot {{slot}}", "A"),
                q("llamacpp_kv_pool_capacity_tokens{S}", "{W} pool capacity", "B"),
            ],
            unit="short",
            stack=True,
            axis_label="tokens (KV cells)",
            overrides=[capacity_line("B", unstacked=True)],
        )
    )


def _usage() -> Panel:
    return timeseries(
        "KV pool usage" + OF_MODEL,
        "llamacpp_kv_pool_usage_ratio (used / capacity) with the 90% line at which LlamaCppKVPoolSaturated pages.",
        [q("llamacpp_kv_pool_usage_ratio{S}", "{W}")],
        unit="percentunit",
        max_=1,
        threshold_steps=thresholds((None, GREEN), (KV_SATURATED_RATIO, RED)),
        threshold_style="line+area",
    )


def _events() -> Panel:
    return timeseries(
        "KV retries, cascades and aborted requests" + OF_MODEL,
        "Events per interval: increase of llamacpp_kv_retries_total ('retrying with smaller batch size' "
        "lines), llamacpp_kv_cascades_total by outcome (recovered/failed), llamacpp_context_exceeded_total "
        "and llamacpp_requests_aborted_total (requests answered with an error).",
        [
            q("sum by ({BY}) (increase(llamacpp_kv_retries_total{S}[$__rate_interval]))", "{W} retries", "A"),
            q(
                "sum by ({BY}, outcome) (increase(llamacpp_kv_cascades_total{S}[$__rate_interval]))",
                "{W} cascade {{outcome}}",
                "B",
            ),
            q(
                "sum by ({BY}) (increase(llamacpp_context_exceeded_total{S}[$__rate_interval]))",
                "{W} context exceeded",
                "C",
            ),
            q(
                "sum by ({BY}, reason) (increase(llamacpp_requests_aborted_total{S}[$__rate_interval]))",
                "{W} aborted ({{reason}})",
                "D",
            ),
        ],
        unit="short",
        bars=True,
    )


def _overcommit() -> Panel:
    return timeseries(
        "Overcommit" + OF_MODEL,
        "llamacpp_kv_pool_overcommit_ratio: what the slots were promised (slots x n_ctx_slot) over what the "
        "pool holds. 1 = every promise can be kept (line); 4 = four slots share one window.",
        [q("llamacpp_kv_pool_overcommit_ratio{S}", "{W}")],
        unit="suffix:×",
        threshold_steps=thresholds((None, GREEN), (1.01, ORANGE)),
        threshold_style="line",
    )


def _slots_processing() -> Panel:
    return state_timeline(
        "Slots processing" + OF_MODEL,
        "llamacpp_slot_processing: 1 while the slot has a task.",
        [q("llamacpp_slot_processing{S}", "{W} slot {{slot}}")],
        mappings=BUSY_MAP,
        steps=thresholds((None, "transparent"), (1, BLUE)),
    )
