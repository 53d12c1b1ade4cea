"""The guard's counts, and their families on `/metrics`.

# HELP llamacpp_guard_requests_total Generation requests through the guard, by outcome …
# TYPE llamacpp_guard_requests_total counter
llamacpp_guard_requests_total{outcome="admitted"} 12.0
llamacpp_guard_requests_total{outcome="queued"} 3.0
# TYPE llamacpp_guard_queue_requests gauge
llamacpp_guard_queue_requests 0.0
# TYPE llamacpp_guard_admitted_demand_tokens gauge
llamacpp_guard_admitted_demand_tokens 1800.0
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from exporter.guard.admission import Admission
from exporter.metrics.catalogue import guard as c
from exporter.metrics.catalogue.guard import OUTCOMES, Outcome
from exporter.model.histogram import Histogram
from exporter.model.request_sizes import REQUEST_TOKEN_BUCKETS

#: Seconds a request waited in the queue: from a moment to the longest wait a client tolerates.
WAIT_BUCKETS: tuple[float, ...] = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


@dataclass
class GuardBooks:
    """What the guard counted since it started."""

    outcomes: Counter[str] = field(default_factory=Counter)
    waits: Histogram = field(default_factory=lambda: Histogram(WAIT_BUCKETS))  # seconds in the queue
    server_wait: float = 0.0  # seconds requests waited because llama-server was down or loading
    server_waiting: int = 0  # requests waiting for it now
    # The buckets of llamacpp_request_prompt_tokens (the log's), so that the two compare bucket by bucket.
    prompts: Histogram = field(default_factory=lambda: Histogram(REQUEST_TOKEN_BUCKETS))
    # The books by client (exporter.guard.accounting.Accounting): told of every count and wait.
    clients: Any = field(default=None, repr=False)

    def sized(self, tokens: int) -> None:
        """A request's prompt, counted exactly by the server's tokenizer."""
        self.prompts.observe(tokens)

    def count(self, outcome: Outcome) -> None:
        self.outcomes[outcome] += 1
        if self.clients is not None:
            self.clients.count(outcome)

    def server_waited(self, seconds: float) -> None:
        """A request waited `seconds` for llama-server to come back (from a restart, or loading its model)."""
        self.server_wait += seconds

    def waited(self, seconds: float) -> None:
        """A request left the queue (admitted, expired or gone) after `seconds`."""
        self.waits.observe(seconds)
        if self.clients is not None:
            self.clients.waited(seconds)

    def answering(self) -> None:
        """The relay sends the head of llama-server's answer to the request being handled (its first byte)."""
        if self.clients is not None:
            self.clients.answering()

    def answered(self, status: int) -> None:
        """The relay sends the end of the answer (`status`) to the request being handled (its last byte)."""
        if self.clients is not None:
            self.clients.answered(status)


class GuardCollector(Collector):
    """The guard's families (see the module's docstring)."""

    def __init__(
        self,
        books: GuardBooks,
        admissions: Callable[[], Iterable[Admission]],
        capacity: Callable[[], int | None],
    ) -> None:
        self._books = books
        self._admissions = admissions
        self._capacity = capacity

    def collect(self) -> Iterator[Metric]:
        b, pools = self._books, list(self._admissions())
        requests = c.GUARD_REQUESTS.counter()
        for outcome in OUTCOMES:
            requests.add_metric([outcome], b.outcomes[outcome])
        yield requests
        yield c.GUARD_SERVER_DOWN_WAIT_SECONDS.counter(b.server_wait)
        yield c.GUARD_SERVER_DOWN_WAITING_REQUESTS.gauge(b.server_waiting)
        yield c.GUARD_QUEUE_REQUESTS.gauge(sum(len(a.queue) for a in pools))
        yield c.GUARD_IN_FLIGHT_REQUESTS.gauge(sum(len(a.in_flight) for a in pools))
        yield c.GUARD_QUEUE_WAIT_SECONDS.histogram(b.waits)
        yield c.GUARD_ADMITTED_DEMAND_TOKENS.gauge(sum(a.demand for a in pools))
        yield c.GUARD_ADMITTED_PROMPT_TOKENS.gauge(sum(t.prompt for a in pools for t in a.in_flight.values()))
        yield c.GUARD_REQUEST_PROMPT_TOKENS.histogram(b.prompts)
        capacity = self._capacity()
        if capacity is not None:
            yield c.GUARD_POOL_LIMIT_TOKENS.gauge(capacity)
