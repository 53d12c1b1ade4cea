"""The requests' rows: prompt evaluation and token rates, then request sizes (is the pool big enough?)."""

from __future__ import annotations

from llamacpp_dashboard.layout import Layout
from llamacpp_dashboard.panels import Panel, per_instance, timeseries
from llamacpp_dashboard.query import DS, OF_MODEL, q


def requests(lay: Layout) -> None:
    """The row "Requests"."""
    lay.row("Requests")
    lay.add(_prompt_eval_time(), 8, 8)
    lay.add(_tokens_per_second(), 8, 8)
    lay.add(_full_reprocess(), 8, 8)


def request_sizes(lay: Layout) -> None:
    """The row "Request sizes: is the pool big enough?"."""
    lay.row("Request sizes: is the pool big enough?")
    lay.add(_request_sizes(), 8, 8)
    lay.add(_in_flight_together(), 8, 8)
    lay.add(_pool_needed(), 8, 8)


def _prompt_eval_time() -> Panel:
    return timeseries(
        "Prompt evaluation time",
        "Quantiles and mean of llamacpp_prompt_eval_seconds (histogram): time llama-server spent evaluating "
        "each prompt. Jumps mean full re-processing (cache misses, invalidated checkpoints).",
        [
            q(
                "histogram_quantile(0.5, sum by ({BY}, le) "
                "(rate(llamacpp_prompt_eval_seconds_bucket{S}[$__rate_interval])))",
                "{W} p50",
                "A",
            ),
            q(
                "histogram_quantile(0.95, sum by ({BY}, le) "
                "(rate(llamacpp_prompt_eval_seconds_bucket{S}[$__rate_interval])))",
                "{W} p95",
                "B",
            ),
            q(
                "sum by ({BY}) (rate(llamacpp_prompt_eval_seconds_sum{S}[$__rate_interval]))\n"
                "/ sum by ({BY}) (rate(llamacpp_prompt_eval_seconds_count{S}[$__rate_interval]))",
                "{W} mean",
                "C",
            ),
        ],
        unit="s",
    )


def _tokens_per_second() -> Panel:
    return timeseries(
        "Tokens per second",
        "rate of llamacpp_prompt_tokens_total (prompt tokens evaluated) and llamacpp_generated_tokens_total "
        "(tokens generated).",
        [
            q("sum by ({BY}) (rate(llamacpp_prompt_tokens_total{S}[$__rate_interval]))", "{W} prompt", "A"),
            q("sum by ({BY}) (rate(llamacpp_generated_tokens_total{S}[$__rate_interval]))", "{W} generated", "B"),
        ],
        unit="short",
        axis_label="tokens/s",
    )


def _full_reprocess() -> Panel:
    return timeseries(
        "Full prompt re-processing",
        "increase of llamacpp_full_reprocess_total ('forcing full prompt re-processing'): a request had to "
        "evaluate its whole prompt again, usually after its checkpoints or cache entry were lost.",
        [q("sum by ({BY}) (increase(llamacpp_full_reprocess_total{S}[$__rate_interval]))", "{W}")],
        unit="short",
        bars=True,
    )


def _request_sizes() -> Panel:
    return per_instance(
        {
            "type": "heatmap",
            "title": "Request sizes",
            "description": "How many requests ended at each size: llamacpp_request_tokens_bucket (histogram), the "
            "KV cells each request held at its release line, aborted ones included. Long requests that run "
            "together are what overflows a shared pool.",
            "datasource": DS,
            "targets": [
                q(
                    "sum by ({BY}, le) (increase(llamacpp_request_tokens_bucket{S}[$__rate_interval]))",
                    "",  # Format as heatmap: the buckets are the `le` label
                    "A",
                    format="heatmap",
                )
            ],
            "fieldConfig": {"defaults": {"unit": "short"}, "overrides": []},
            "options": {
                "calculate": False,
                "cellGap": 1,
                "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
                "yAxis": {"axisPlacement": "left", "unit": "short"},
                "rowsFrame": {"layout": "auto"},
                "tooltip": {"mode": "single", "yHistogram": False},
                "legend": {"show": True},
            },
        }
    )


def _in_flight_together() -> Panel:
    return timeseries(
        "Requests in flight together",
        "llamacpp_requests_in_flight (slots with a task, now) and the p99 over the last day of "
        "llamacpp_request_concurrency_bucket (histogram; recorded as "
        "instance:llamacpp_request_concurrency:p99_1d): how many requests ran at once, sampled at each start.",
        [
            q("sum by ({BY}) (llamacpp_requests_in_flight{S})", "{W} now", "A"),
            q("max by ({BY}) (instance:llamacpp_request_concurrency:p99_1d{S})", "{W} p99 (1d)", "B"),
        ],
        unit="short",
        axis_label="requests",
    )


def _pool_needed() -> Panel:
    return timeseries(
        "The pool you need and the pool you have" + OF_MODEL,
        "Over the last day: the most the conversations in flight or coming back held together "
        "(instance:llamacpp_kv_pool_active_tokens:max_1d, what LlamaCppKVPoolUndersized reads: past 90 % of the "
        "pool it warns; reaching the pool within 3 days at the day-over-day growth of the median of the busy "
        "samples warns too, with the days and the date: instance:llamacpp_kv_pool_full_in_days:1d), the largest "
        "request held "
        "times the requests in flight together at the busiest moments (instance:llamacpp_kv_pool_needed_tokens:1d); "
        "against llamacpp_kv_pool_capacity_tokens.",
        [
            q("max by ({BY}) (instance:llamacpp_kv_pool_active_tokens:max_1d{S})", "{W} held together (1d)", "C"),
            q("max by ({BY}) (instance:llamacpp_kv_pool_needed_tokens:1d{S})", "{W} largest x p99", "A"),
            q("max by ({BY}) (llamacpp_kv_pool_capacity_tokens{S})", "{W} pool", "B"),
        ],
        unit="short",
        axis_label="KV cells",
    )
