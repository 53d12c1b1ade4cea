"""The request-size collector: what requests ask of the KV pool (exporter.model.request_sizes), per scrape."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from exporter.metrics.catalogue import server as c
from exporter.model.view import ServerView


class RequestSizeCollector(Collector):
    """Request sizes and concurrency, from each request's release line and start.

    # HELP llamacpp_request_tokens KV cells each request held when it ended (its 'stop processing' line).
    # TYPE llamacpp_request_tokens histogram
    llamacpp_request_tokens_bucket{le="64.0"} 0.0
    …
    llamacpp_request_tokens_bucket{le="262144.0"} 12.0
    llamacpp_request_tokens_bucket{le="+Inf"} 12.0
    llamacpp_request_tokens_count 12.0
    llamacpp_request_tokens_sum 611230.0
    # HELP llamacpp_request_concurrency Requests in flight together, sampled at each request's start (itself included).
    # TYPE llamacpp_request_concurrency histogram
    llamacpp_request_concurrency_bucket{le="1.0"} 5.0
    …
    # HELP llamacpp_requests_in_flight Requests llama-server is processing now (slots with a task).
    # TYPE llamacpp_requests_in_flight gauge
    llamacpp_requests_in_flight 2.0
    # HELP llamacpp_requests_queued Requests waiting for a slot (llama-server's own /metrics: requests_deferred; …
    # TYPE llamacpp_requests_queued gauge
    llamacpp_requests_queued 0.0
    """

    def __init__(self, view: Callable[[], ServerView]) -> None:
        self._view = view  # the unit's view of this scrape

    def collect(self) -> Iterator[Metric]:
        view = self._view()
        st = view.state
        yield c.REQUEST_TOKENS.histogram(st.request_tokens)
        yield c.REQUEST_PROMPT_TOKENS.histogram(st.request_prompt_tokens)
        yield c.REQUEST_CONCURRENCY.histogram(st.request_concurrency)
        yield c.REQUESTS_IN_FLIGHT.gauge(sum(1 for s in st.run.slots.values() if s.processing))
        if view.requests_deferred is not None or view.requests_guard_queued is not None:
            yield c.REQUESTS_QUEUED.gauge((view.requests_deferred or 0) + (view.requests_guard_queued or 0))
