"""Whether llama-server is up, and what each endpoint answered (`exporter.sources.server_http`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from exporter.metrics.catalogue import live as c
from exporter.model.live import ENDPOINTS, ROUTER_ENDPOINTS, HttpSnapshot


class ServerHttpCollector(Collector):
    """Whether llama-server is up or loading, and what each endpoint answered, from the last read.

    # HELP llamacpp_up 1 when llama-server answers /health with 200.
    # TYPE llamacpp_up gauge
    llamacpp_up 1.0
    # HELP llamacpp_server_loading 1 while llama-server answers /health with 503 Loading model.
    # TYPE llamacpp_server_loading gauge
    llamacpp_server_loading 0.0
    # HELP llamacpp_exporter_http_status Last HTTP status of each llama-server endpoint (0 = no answer).
    # TYPE llamacpp_exporter_http_status gauge
    llamacpp_exporter_http_status{endpoint="/slots"} 200.0
    # HELP llamacpp_exporter_http_values_rejected_total Reads of llama-server's /metrics whose value was absent …
    # TYPE llamacpp_exporter_http_values_rejected_total counter
    llamacpp_exporter_http_values_rejected_total{endpoint="/metrics",metric="llamacpp:requests_deferred"} 0.0
    """

    def __init__(
        self, snapshot: Callable[[], HttpSnapshot | None], rejected: Callable[[], Mapping[str, int]] = dict
    ) -> None:
        self._snapshot = snapshot
        self._rejected = rejected  # reads whose /metrics value was not understood, by metric (a fixed set)

    def collect(self) -> Iterator[Metric]:
        """Yield up, loading and the per-endpoint status."""
        snap = self._snapshot() or HttpSnapshot()
        yield c.UP.gauge(int(snap.up))
        yield c.SERVER_LOADING.gauge(int(snap.loading))
        status = c.EXPORTER_HTTP_STATUS.gauge()
        for ep in ROUTER_ENDPOINTS if "/models" in snap.status else ENDPOINTS:
            status.add_metric([ep], snap.status.get(ep, 0))
        yield status
        rejected = self._rejected()
        if rejected and "/models" not in snap.status:  # a router's own endpoints have no /metrics read
            family = c.EXPORTER_HTTP_VALUES_REJECTED.counter()
            for name, n in rejected.items():
                family.add_metric(["/metrics", name], n)
            yield family
