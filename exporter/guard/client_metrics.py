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

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from exporter.guard.accounting import Accounting
from exporter.guard.books import OUTCOMES


class ClientCollector(Collector):
    """Requests, cells, tokens and queue waits by client; `live_slots` gives the exporter's latest `/slots`."""

    def __init__(self, accounting: Accounting, live_slots: Callable[[], Iterable[Any] | None] = lambda: None) -> None:
        self._accounting = accounting
        self._live_slots = live_slots

    def collect(self) -> Iterator[Metric]:
        a = self._accounting
        clients = sorted(a.clients.items())
        requests = CounterMetricFamily(
            "llamacpp_guard_client_requests",
            "Generation requests through the guard by client and outcome (the outcomes of "
            "llamacpp_guard_requests_total). Clients are named by --guard.client-from; at most "
            "--guard.max-clients names, the rest 'other'.",
            labels=["client", "outcome"],
        )
        for name, b in clients:
            # Every outcome the guard counts, also those it may add later.
            for outcome in sorted(set(OUTCOMES) | set(b.outcomes)):
                requests.add_metric([name, outcome], b.outcomes[outcome])
        yield requests
        cells = GaugeMetricFamily(
            "llamacpp_guard_client_pool_tokens",
            "KV cells each client's requests hold in the pool now: their slots' cells in /slots (requests matched "
            "to slots by prompt size and n_predict; a request not matched yet counts 0).",
            labels=["client"],
        )
        for name, n in sorted(a.pool_tokens(self._live_slots()).items()):
            cells.add_metric([name], n)
        yield cells
        in_flight = GaugeMetricFamily(
            "llamacpp_guard_client_in_flight_requests",
            "Generation requests of each client the guard is handling now (waiting in its queue or running).",
            labels=["client"],
        )
        prompts = CounterMetricFamily(
            "llamacpp_guard_client_prompt_tokens",
            "Prompt tokens of each client's ended requests, counted with llama-server's tokenizer.",
            labels=["client"],
        )
        generated = CounterMetricFamily(
            "llamacpp_guard_client_generated_tokens",
            "Tokens generated for each client's ended requests, as /slots last showed them while they ran.",
            labels=["client"],
        )
        waits = SummaryMetricFamily(
            "llamacpp_guard_client_queue_wait_seconds",
            "Time each client's requests waited in the guard's queue (count: requests that waited).",
            labels=["client"],
        )
        for name, b in clients:
            in_flight.add_metric([name], b.in_flight)
            prompts.add_metric([name], b.prompt_tokens)
            generated.add_metric([name], b.generated_tokens)
            waits.add_metric([name], count_value=b.wait_count, sum_value=b.wait_sum)
        yield from (in_flight, prompts, generated, waits)
        yield GaugeMetricFamily(
            "llamacpp_guard_clients_limit",
            "Client names the guard keeps apart at most (--guard.max-clients); later ones count as 'other'.",
            value=a.namer.max_clients,
        )
        log = a.access_log
        if log is not None:
            yield CounterMetricFamily(
                "llamacpp_guard_access_log_lines", "Lines written to the guard's access log.", value=log.written
            )
            dropped = CounterMetricFamily(
                "llamacpp_guard_access_log_dropped_lines",
                "Access log lines not written, by reason: queue_full (the writer fell behind), write_error.",
                labels=["reason"],
            )
            for reason in ("queue_full", "write_error"):
                dropped.add_metric([reason], log.dropped[reason])
            yield dropped
            yield CounterMetricFamily(
                "llamacpp_guard_access_log_rotations",
                "Times the access log passed its size limit and was moved to PATH.1.",
                value=log.rotations,
            )
