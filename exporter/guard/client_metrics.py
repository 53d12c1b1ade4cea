"""The guard's families by client on `/metrics`, and its access log's health.

At most `--guard.max-clients` client names plus `other` (and `unknown` when the address is not a
source) ever appear, so each family has at most that many series per outcome:

    # TYPE llamacpp_guard_client_requests_total counter
    llamacpp_guard_client_requests_total{client="orchestrator",outcome="admitted"} 12.0
    # TYPE llamacpp_guard_client_pool_tokens gauge
    llamacpp_guard_client_pool_tokens{client="orchestrator"} 159069.0
    llamacpp_guard_client_pool_tokens{client="claude-cli"} 3120.0
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from exporter.guard.accounting import Accounting
from exporter.metrics.catalogue import guard as c
from exporter.metrics.catalogue.guard import DROP_REASONS, OUTCOMES


class ClientCollector(Collector):
    """Requests, cells, tokens and queue waits by client; `live_slots` gives the exporter's latest `/slots`."""

    def __init__(self, accounting: Accounting, live_slots: Callable[[], Iterable[Any] | None] = lambda: None) -> None:
        self._accounting = accounting
        self._live_slots = live_slots

    def collect(self) -> Iterator[Metric]:
        a = self._accounting
        clients = sorted(a.clients.items())
        requests = c.GUARD_CLIENT_REQUESTS.counter()
        for name, b in clients:
            # Every outcome the guard counts, also those it may add later.
            for outcome in sorted(set(OUTCOMES) | set(b.outcomes)):
                requests.add_metric([name, outcome], b.outcomes[outcome])
        yield requests
        cells = c.GUARD_CLIENT_POOL_TOKENS.gauge()
        for name, n in sorted(a.pool_tokens(self._live_slots()).items()):
            cells.add_metric([name], n)
        yield cells
        in_flight = c.GUARD_CLIENT_IN_FLIGHT_REQUESTS.gauge()
        prompts = c.GUARD_CLIENT_PROMPT_TOKENS.counter()
        generated = c.GUARD_CLIENT_GENERATED_TOKENS.counter()
        waits = c.GUARD_CLIENT_QUEUE_WAIT_SECONDS.histogram_family()
        first_bytes = c.GUARD_CLIENT_TIME_TO_FIRST_BYTE_SECONDS.histogram_family()
        durations = c.GUARD_CLIENT_REQUEST_DURATION_SECONDS.histogram_family()
        for name, b in clients:
            in_flight.add_metric([name], b.in_flight)
            prompts.add_metric([name], b.prompt_tokens)
            generated.add_metric([name], b.generated_tokens)
            waits.add((name,), b.waits)
            first_bytes.add((name,), b.first_bytes)
            durations.add((name,), b.durations)
        yield from (in_flight, prompts, generated, waits, first_bytes, durations)
        yield c.GUARD_CLIENTS_LIMIT.gauge(a.namer.max_clients)
        log = a.access_log
        if log is not None:
            yield c.GUARD_ACCESS_LOG_LINES.counter(log.written)
            dropped = c.GUARD_ACCESS_LOG_DROPPED_LINES.counter()
            for reason in DROP_REASONS:
                dropped.add_metric([reason], log.dropped[reason])
            yield dropped
            yield c.GUARD_ACCESS_LOG_ROTATIONS.counter(log.rotations)
