"""The row "Request latency": time to first token by cache outcome, time per output token, request duration."""

from __future__ import annotations

from llamacpp_dashboard.layout import Layout
from llamacpp_dashboard.panels import Panel, timeseries
from llamacpp_dashboard.query import q


def latency(lay: Layout) -> None:
    """The row "Request latency"."""
    lay.row("Request latency")
    lay.add(_time_to_first_token(), 8, 8)
    lay.add(_time_per_output_token(), 8, 8)
    lay.add(_request_duration(), 8, 8)


def _quantiles(family: str, by: str = "", label: str = "") -> list[dict[str, object]]:
    """p50 and p95 of a histogram per server (and `by`, shown in the legend as `label`)."""
    group = "{BY}" + (", " + by if by else "")
    return [
        q(
            f"histogram_quantile({quantile}, sum by ({group}, le) (rate({family}_bucket{{S}}[$__rate_interval])))",
            f"{{W}} {label}p{round(quantile * 100)}",
            ref,
        )
        for quantile, ref in ((0.5, "A"), (0.95, "B"))
    ]


def _time_to_first_token() -> Panel:
    return timeseries(
        "Time to first token by cache outcome",
        "p50 and p95 of llamacpp_time_to_first_token_seconds (histogram) by its cache label: each request's prompt "
        "evaluation ('prompt eval time'; the wait for a slot is not in it) under the cache outcome its log shows: "
        "full_reprocess (no usable checkpoint or cache), checkpoint_restored, cached (at least half the prompt "
        "from a cache), cold, unknown (cache lines hidden: run llama-server with -lv 4). Slow first tokens under "
        "full_reprocess are checkpoint misses.",
        _quantiles("llamacpp_time_to_first_token_seconds", "cache", "{{cache}} "),
        unit="s",
    )


def _time_per_output_token() -> Panel:
    return timeseries(
        "Time per output token",
        "p50 and p95 of llamacpp_time_per_output_token_seconds (histogram): each request's mean time per generated "
        "token ('eval time' ms / tokens).",
        _quantiles("llamacpp_time_per_output_token_seconds"),
        unit="s",
    )


def _request_duration() -> Panel:
    return timeseries(
        "Request duration",
        "p50 and p95 of llamacpp_request_duration_seconds (histogram): each request's prompt evaluation and "
        "generation in llama-server ('total time'; its wait for a slot and the network not included).",
        _quantiles("llamacpp_request_duration_seconds"),
        unit="s",
    )
