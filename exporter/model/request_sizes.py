"""Histograms of what requests ask of the KV pool: their size and how many run at once. Pure.

They answer "is the pool big enough for the requests this server really gets?" days before an
overflow: the p99 request size times the p99 number of requests in flight together, against the
pool's capacity (`LlamaCppKVPoolUndersized`, and `diagnose`'s history).

- request tokens: the cells each request held when it ended (its `stop processing: n_tokens = N`
  release line, aborted requests included);
- prompt tokens: its prompt's size, where the log gives it (`new prompt … task.n_tokens`, -lv 4; or
  the estimate from `prompt processing` progress lines), counted at the same release;
- concurrency: at each request's start, how many requests were in flight with it (itself included).

Buckets are fixed, the same for every server, so that histograms of several servers add up
(`exporter.model.histogram.Histogram`, the one histogram type). A quantile from them is an estimate
(interpolated in its bucket); `diagnose`, which reads every value, keeps them exactly (`ExactValues`).

    >>> from exporter.model.histogram import Histogram
    >>> h = Histogram(REQUEST_TOKEN_BUCKETS)
    >>> for n in (100, 3000, 3000, 200_000):
    ...     h.observe(n)
    >>> h.count, h.sum, h.cumulative()[:3]
    (4, 206100.0, [(64.0, 0), (128.0, 1), (256.0, 1)])
    >>> round(h.quantile(0.5))
    3072
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

_V = TypeVar("_V", int, float)  # a value counted: tokens, requests, milliseconds

#: 64 to 1Mi tokens, doubling: 15 buckets (and +Inf), 18 series a server. A quantile from a histogram is
#: interpolated within its bucket, so it may be up to twice the true value (never more).
REQUEST_TOKEN_BUCKETS: tuple[float, ...] = tuple(float(64 << i) for i in range(15))
#: Requests in flight together: each count up to 8, then coarser (more slots than 64 share one bucket).
CONCURRENCY_BUCKETS: tuple[float, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 64)
#: Prompt evaluation time in seconds: from a cached few-token prompt (ms) to a full re-processing of a
#: long context (minutes).
PROMPT_EVAL_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)


@dataclass
class ExactValues:
    """Every request's size and every start's concurrency, as value -> count (`diagnose` only: it has the
    whole log and reports exact quantiles; the exporter keeps the bounded histograms above)."""

    tokens: Counter[int] = field(default_factory=Counter)
    concurrency: Counter[int] = field(default_factory=Counter)
    # Every first token's time (its `prompt eval time` in ms) by its cache outcome (exporter.model.latency's
    # `cache_outcome`, the exporter's `cache` label): exactly up to FIRST_TOKEN_EXACT distinct times, then to
    # 4 significant digits (`first_token_key`: at most 9,000 a decade, so a run of millions of requests stays
    # small; those outcomes are in `first_token_rounded`), and the largest exactly.
    first_token_ms: dict[str, Counter[float]] = field(default_factory=dict)
    first_token_rounded: set[str] = field(default_factory=set)
    first_token_max_ms: dict[str, float] = field(default_factory=dict)

    def first_token(self, outcome: str, ms: float) -> None:
        """One first token of `outcome` that took `ms` milliseconds."""
        times = self.first_token_ms.setdefault(outcome, Counter())
        rounded = outcome in self.first_token_rounded
        times[first_token_key(ms) if rounded else ms] += 1
        if not rounded and len(times) > FIRST_TOKEN_EXACT:
            self.first_token_rounded.add(outcome)
            coarse: Counter[float] = Counter()
            for value, n in times.items():
                coarse[first_token_key(value)] += n
            self.first_token_ms[outcome] = coarse
        if ms > self.first_token_max_ms.get(outcome, -1.0):
            self.first_token_max_ms[outcome] = ms


#: Distinct first-token times `ExactValues` keeps exactly, per cache outcome, before it rounds them.
FIRST_TOKEN_EXACT = 4096


def first_token_key(ms: float) -> float:
    """A first token's time as `ExactValues` keeps it: 4 significant digits (exact below 100 ms, as printed).

    >>> first_token_key(29.33), first_token_key(12345.67), first_token_key(0.35)
    (29.33, 12350.0, 0.35)
    """
    return float(f"{ms:.4g}")


def exact_quantile(values: Sequence[tuple[_V, int]], q: float) -> _V | None:
    """The q-quantile of sorted (value, count) pairs by nearest rank: the smallest value with at least
    q of all values at or below it (always a value that occurred).

    >>> exact_quantile([(16_500, 1), (45_000, 1), (70_000, 1)], 0.5)
    45000
    >>> exact_quantile([(1, 60), (2, 30), (3, 10)], 0.99), exact_quantile([], 0.5)
    (3, None)
    """
    total = sum(n for _, n in values)
    if not total:
        return None
    rank = max(1, math.ceil(q * total - 1e-9))
    seen = 0
    for v, n in values:
        seen += n
        if seen >= rank:
            return v
    return values[-1][0]


@dataclass(frozen=True)
class RequestSizes:
    """One run's request sizes and concurrencies, exactly (value, count), sorted: `diagnose` keeps one
    per run of a history, to add up the runs that are not copies of others."""

    tokens: tuple[tuple[int, int], ...]  # (tokens a request held at its release, how many requests)
    concurrency: tuple[tuple[int, int], ...]  # (requests in flight at a start, how many starts)

    @classmethod
    def of(cls, values: ExactValues | None) -> RequestSizes | None:
        """The run's values; None when it had no request."""
        if values is None or (not values.tokens and not values.concurrency):
            return None
        return cls(tuple(sorted(values.tokens.items())), tuple(sorted(values.concurrency.items())))

    def add_to(self, values: ExactValues) -> None:
        values.tokens.update(dict(self.tokens))
        values.concurrency.update(dict(self.concurrency))


@dataclass
class RequestSummary:
    """What the requests of a history asked of the pool: exact quantiles over every request's size (its
    release line) and every start's concurrency, and the pool that would have held them."""

    requests: int
    tokens_p50: int | None
    tokens_p90: int | None
    tokens_p99: int | None
    tokens_max: int  # the largest request (release lines, and prompts where the log gave their size)
    concurrency_p50: int | None
    concurrency_p99: int | None
    concurrency_max: int | None  # the most requests in flight at a request's start
    pool_cells: int | None  # the largest pool of the runs
    pool_needed: int | None  # p99 request x p99 in flight together (exactly the figures printed)
    quantiles: str = "exact"  # how the quantiles were computed: exact (over every value)

    @property
    def undersized(self) -> bool | None:
        """The pool could not hold the p99 request times the p99 concurrency (None: unknown)."""
        if self.pool_needed is None or self.pool_cells is None:
            return None
        return self.pool_needed > self.pool_cells


def summarize(values: ExactValues, tokens_max: int, pool_cells: int | None) -> RequestSummary:
    """The summary of a history's values (exact quantiles, nearest rank).

    >>> v = ExactValues()
    >>> v.tokens.update({16_500: 1, 45_000: 1, 70_000: 1})
    >>> v.concurrency.update({1: 1, 2: 1, 3: 1})
    >>> s = summarize(v, 70_000, 131_072)
    >>> s.tokens_p50, s.tokens_p99, s.concurrency_p99, s.pool_needed, s.undersized
    (45000, 70000, 3, 210000, True)
    """
    tokens, conc = sorted(values.tokens.items()), sorted(values.concurrency.items())
    p99, c99 = exact_quantile(tokens, 0.99), exact_quantile(conc, 0.99)
    return RequestSummary(
        requests=sum(values.tokens.values()),
        tokens_p50=exact_quantile(tokens, 0.5),
        tokens_p90=exact_quantile(tokens, 0.9),
        tokens_p99=p99,
        tokens_max=max(tokens_max, tokens[-1][0] if tokens else 0),
        concurrency_p50=exact_quantile(conc, 0.5),
        concurrency_p99=c99,
        concurrency_max=conc[-1][0] if conc else None,
        pool_cells=pool_cells,
        pool_needed=None if p99 is None or c99 is None else p99 * c99,
    )
