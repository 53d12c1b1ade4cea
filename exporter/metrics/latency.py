"""The request-latency collector: each finished request's timings (exporter.model.latency), per scrape."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from exporter.metrics.catalogue import server as c
from exporter.model.view import ServerView


class LatencyCollector(Collector):
    """Time to first token by cache outcome, per output token, end to end, tokens per request, cache reuse, why
    requests ended, speculative decoding.

    # HELP llamacpp_time_to_first_token_seconds Time to first token of each finished request as the log …
    # TYPE llamacpp_time_to_first_token_seconds histogram
    llamacpp_time_to_first_token_seconds_bucket{cache="cached",le="0.005"} 0.0
    …
    llamacpp_time_to_first_token_seconds_count{cache="full_reprocess"} 1.0
    llamacpp_time_to_first_token_seconds_sum{cache="full_reprocess"} 94.2
    """

    def __init__(self, view: Callable[[], ServerView]) -> None:
        self._view = view  # the unit's view of this scrape

    def collect(self) -> Iterator[Metric]:
        lat = self._view().state.latency
        yield c.TIME_TO_FIRST_TOKEN.histograms(lat.ttft)
        yield c.TIME_PER_OUTPUT_TOKEN.histogram(lat.tpot)
        yield c.REQUEST_DURATION.histogram(lat.duration)
        yield c.REQUEST_PROMPT_EVAL_TOKENS.histogram(lat.prompt_tokens)
        yield c.REQUEST_GENERATION_TOKENS.histogram(lat.generation_tokens)
        yield c.PROMPT_CACHED_TOKENS.counter(lat.cached_tokens)
        yield c.PROMPT_REPROCESSED_TOKENS.counter(lat.reprocessed_tokens)
        yield c.REQUEST_FINISH_REASONS.counts(lat.finish_reasons)
        yield c.SPEC_DECODE_DRAFT_TOKENS.counter(lat.draft_generated)
        yield c.SPEC_DECODE_ACCEPTED_TOKENS.counter(lat.draft_accepted)
