"""Where the KV pool is heading (`KVForecastCollector`); the model is `exporter.model.forecast`."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from exporter.metrics.catalogue import server as c
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
        demand = c.KV_POOL_DEMAND_TOKENS.gauge()
        for h in HORIZONS:
            demand.add_metric([h], f.demand(h))
        yield demand
        if f.capacity:
            ratio = c.KV_POOL_DEMAND_RATIO.gauge()
            for h in HORIZONS:
                ratio.add_metric([h], f.demand(h) / f.capacity)
            yield ratio
        yield from _active(view, f.capacity)
        eta = f.eta_seconds
        if eta is not None:
            yield c.KV_POOL_FULL_ETA_SECONDS.gauge(eta)
        yield c.KV_POOL_FILL_RATE_TOKENS_PER_SECOND.gauge(f.fill_rate)
        by_source = c.KV_POOL_DEMAND_SLOTS.gauge()
        for name, n in f.sources().items():
            by_source.add_metric([name], n)
        yield by_source
        yield c.KV_POOL_DEMAND_UNKNOWN_BUDGET_SLOTS.gauge(f.unknown_budgets)
        per_slot = c.SLOT_DEMAND_TOKENS.gauge()
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
    yield c.KV_POOL_ACTIVE_TOKENS.gauge(view.active_tokens)
    if capacity:
        yield c.KV_POOL_ACTIVE_RATIO.gauge(view.active_tokens / capacity)
    yield c.KV_POOL_ACTIVE_WINDOW_SECONDS.gauge(view.active_window)
