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
from typing import Any, Literal, get_args

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter.guard.admission import Admission
from exporter.metrics.families import histogram
from exporter.model.histogram import Histogram
from exporter.model.request_sizes import REQUEST_TOKEN_BUCKETS

#: Outcomes of a generation request (a request may count under more than one: queued, then admitted). A
#: type: mypy rejects a count of any other; `OUTCOMES`, the label values, is made from it.
Outcome = Literal["admitted", "queued", "refused", "preempted", "replayed", "retried", "failed", "unsized"]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
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
        requests = CounterMetricFamily(
            "llamacpp_guard_requests",
            "Generation requests through the guard, by outcome: admitted (sent to llama-server), queued (had to "
            "wait for room first), refused (answered 429/503 by the guard, or too large for a slot), preempted "
            "(stopped so that the others could finish), replayed (sent again after a preemption), retried (sent "
            "again after llama-server died before answering), failed (llama-server could not be reached, broke "
            "the connection, or the retries were spent), unsized (passed on unsized: not JSON "
            "the guard could read).",
            labels=["outcome"],
        )
        for outcome in OUTCOMES:
            requests.add_metric([outcome], b.outcomes[outcome])
        yield requests
        yield CounterMetricFamily(
            "llamacpp_guard_server_down_wait_seconds",
            "Seconds requests waited in the guard because llama-server was down or loading its model (summed "
            "over requests: two requests waiting 3 s add 6 s).",
            value=b.server_wait,
        )
        yield GaugeMetricFamily(
            "llamacpp_guard_server_down_waiting_requests",
            "Requests waiting in the guard now for llama-server to be ready again (down, restarting, or loading "
            "its model).",
            value=b.server_waiting,
        )
        yield GaugeMetricFamily(
            "llamacpp_guard_queue_requests",
            "Requests waiting in the guard's queue for room in the KV pool.",
            value=sum(len(a.queue) for a in pools),
        )
        yield GaugeMetricFamily(
            "llamacpp_guard_in_flight_requests",
            "Generation requests the guard has sent to llama-server and not yet seen end.",
            value=sum(len(a.in_flight) for a in pools),
        )
        yield histogram(
            "llamacpp_guard_queue_wait_seconds",
            "Time requests waited in the guard's queue before they were admitted, refused or abandoned.",
            b.waits,
        )
        yield GaugeMetricFamily(
            "llamacpp_guard_admitted_demand_tokens",
            "KV cells the requests in flight through the guard may hold at most (prompt plus generation budget).",
            value=sum(a.demand for a in pools),
        )
        yield GaugeMetricFamily(
            "llamacpp_guard_admitted_prompt_tokens",
            "KV cells the requests in flight through the guard will hold once their prompts are read, exact at "
            "arrival (the server's own tokenizer), whatever llama-server's log verbosity shows.",
            value=sum(t.prompt for a in pools for t in a.in_flight.values()),
        )
        yield histogram(
            "llamacpp_guard_request_prompt_tokens",
            "Prompt sizes the guard counted with llama-server's tokenizer (not those admitted on their byte "
            "length while less than half the pool was promised).",
            b.prompts,
        )
        capacity = self._capacity()
        if capacity is not None:
            yield GaugeMetricFamily(
                "llamacpp_guard_pool_limit_tokens",
                "KV cells the guard admits requests against (the shared pool, else one slot's window).",
                value=capacity,
            )
