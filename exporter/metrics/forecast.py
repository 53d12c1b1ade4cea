"""Where the KV pool is heading (`KVForecastCollector`); the model is `exporter.model.forecast`."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import (
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from exporter.model.forecast import HORIZONS, forecast
from exporter.model.view import ServerView


class KVForecastCollector(Collector):
    """Where the KV pool is heading: demand of the requests in flight and the time until it is full.

    See `exporter.model.forecast` for the model. Demand is exported for both horizons whenever the slot
    count is known (0 with nothing in flight); the ETA only while the pool fills towards full.

    # HELP llamacpp_kv_pool_demand_tokens KV cells the requests in flight will hold: horizon="prompt" once …
    # TYPE llamacpp_kv_pool_demand_tokens gauge
    llamacpp_kv_pool_demand_tokens{horizon="prompt"} 36000.0
    llamacpp_kv_pool_demand_tokens{horizon="limits"} 36000.0
    llamacpp_kv_pool_demand_tokens{horizon="max"} 65536.0
    # HELP llamacpp_kv_pool_demand_ratio llamacpp_kv_pool_demand_tokens / llamacpp_kv_pool_capacity_tokens …
    # TYPE llamacpp_kv_pool_demand_ratio gauge
    llamacpp_kv_pool_demand_ratio{horizon="prompt"} 1.0986328125
    # HELP llamacpp_kv_pool_active_tokens KV cells of the conversations in flight or coming back: …
    # TYPE llamacpp_kv_pool_active_tokens gauge
    llamacpp_kv_pool_active_tokens 31500.0
    # HELP llamacpp_kv_pool_active_ratio llamacpp_kv_pool_active_tokens / llamacpp_kv_pool_capacity_tokens …
    # TYPE llamacpp_kv_pool_active_ratio gauge
    llamacpp_kv_pool_active_ratio 0.9613037109375
    # HELP llamacpp_kv_pool_full_eta_seconds Seconds until the requests in flight fill the KV pool at …
    # TYPE llamacpp_kv_pool_full_eta_seconds gauge
    llamacpp_kv_pool_full_eta_seconds 84.2
    # HELP llamacpp_kv_pool_demand_slots Processing slots by how their prompt size is known: …
    # TYPE llamacpp_kv_pool_demand_slots gauge
    llamacpp_kv_pool_demand_slots{source="new_prompt"} 0.0
    llamacpp_kv_pool_demand_slots{source="progress"} 3.0
    llamacpp_kv_pool_demand_slots{source="held"} 1.0
    """

    def __init__(self, view: Callable[[], ServerView]) -> None:
        self._view = view  # the unit's view of this scrape

    def collect(self) -> Iterator[Metric]:
        """Yield the forecast families (counting the requests in flight that the guard measured at arrival: exact
        before the log says their size)."""
        view = self._view()
        st = view.state
        count = st.run.slot_count
        if count is None:
            return
        f = forecast(st, view.measured)
        sources = "prompt sizes from 'new prompt' lines (-lv 4) or progress lines (X / progress), else the cells held"
        demand = GaugeMetricFamily(
            "llamacpp_kv_pool_demand_tokens",
            'KV cells the requests in flight will hold: horizon="prompt" once their prompts are processed, '
            'horizon="max" at most (plus the generation budget left, from /slots; unknown = the slot\'s whole '
            'window), horizon="limits" as max but a request without a known budget counts its prompt; idle '
            f"slots excluded ({sources}).",
            labels=["horizon"],
        )
        for h in HORIZONS:
            demand.add_metric([h], f.demand(h))
        yield demand
        if f.capacity:
            ratio = GaugeMetricFamily(
                "llamacpp_kv_pool_demand_ratio",
                "llamacpp_kv_pool_demand_tokens / llamacpp_kv_pool_capacity_tokens; above 1 the pool overflows "
                "(and llama-server aborts every request in flight) unless a request ends first.",
                labels=["horizon"],
            )
            for h in HORIZONS:
                ratio.add_metric([h], f.demand(h) / f.capacity)
            yield ratio
        yield from _active(view, f.capacity)
        eta = f.eta_seconds
        if eta is not None:
            yield GaugeMetricFamily(
                "llamacpp_kv_pool_full_eta_seconds",
                "Seconds until the requests in flight fill the KV pool at their current speed (llama-server's "
                "own prompt and generation speeds); absent when the pool is not filling or cannot fill.",
                value=eta,
            )
        yield GaugeMetricFamily(
            "llamacpp_kv_pool_fill_rate_tokens_per_second",
            "Tokens per second the requests in flight add to the KV pool (latest prompt-processing and "
            "generation speeds in the log).",
            value=f.fill_rate,
        )
        by_source = GaugeMetricFamily(
            "llamacpp_kv_pool_demand_slots",
            "Processing slots by how their prompt size is known: new_prompt (-lv 4 line), progress (progress "
            "lines, default verbosity), held (not known yet: counts the cells it holds).",
            labels=["source"],
        )
        for name, n in f.sources().items():
            by_source.add_metric([name], n)
        yield by_source
        yield GaugeMetricFamily(
            "llamacpp_kv_pool_demand_unknown_budget_slots",
            "Processing slots whose generation budget is unknown or unlimited (counted at their whole window "
            "in the max horizon); /slots (--server-url) gives it.",
            value=f.unknown_budgets,
        )
        per_slot = GaugeMetricFamily(
            "llamacpp_slot_demand_tokens",
            "KV cells the slot's request will hold once its prompt is processed (horizon=prompt) and at most "
            "(horizon=max); 0 while the slot is idle.",
            labels=["slot", "horizon"],
        )
        by_slot = {d.slot: d for d in f.slots}
        for i in range(count):
            d = by_slot.get(i)
            per_slot.add_metric([str(i), "prompt"], d.prompt if d else 0)
            per_slot.add_metric([str(i), "max"], d.max if d else 0)
        yield per_slot


def _active(view: ServerView, capacity: int | None) -> Iterator[Metric]:
    """The cells of the conversations in flight or coming back (`exporter.model.activity`), and their share."""
    if view.active_tokens is None or view.active_window is None:
        return
    yield GaugeMetricFamily(
        "llamacpp_kv_pool_active_tokens",
        "KV cells of the conversations in flight or coming back: slots processing now, and idle slots whose "
        "last turn ended within llamacpp_kv_pool_active_window_seconds (an agent running its tools; the most "
        "the slot held in that turn, also if another task's start cleared it).",
        value=view.active_tokens,
    )
    if capacity:
        yield GaugeMetricFamily(
            "llamacpp_kv_pool_active_ratio",
            "llamacpp_kv_pool_active_tokens / llamacpp_kv_pool_capacity_tokens: above 0.9 the conversations "
            "coming back leave no room (LlamaCppKVPoolSaturated).",
            value=view.active_tokens / capacity,
        )
    yield GaugeMetricFamily(
        "llamacpp_kv_pool_active_window_seconds",
        "How long after its last turn an idle slot's conversation counts in llamacpp_kv_pool_active_tokens "
        "(--kv-pool-active-window).",
        value=view.active_window,
    )
