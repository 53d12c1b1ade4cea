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
(`exporter.model.histogram.Histogram`, the one histogram type).

    >>> h = Histogram(REQUEST_TOKEN_BUCKETS)
    >>> for n in (100, 3000, 3000, 200_000):
    ...     h.observe(n)
    >>> h.count, h.sum, h.cumulative()[:3]
    (4, 206100.0, [(64.0, 0), (128.0, 1), (256.0, 1)])
    >>> round(h.quantile(0.5))
    3072
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.model.histogram import Histogram

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


@dataclass(frozen=True)
class RequestSizes:
    """One run's request-size and concurrency histograms, kept small (only the buckets that were hit):
    `diagnose` keeps one per run of a history, to add up the runs that are not copies of others."""

    tokens: tuple[tuple[int, int], ...]  # (bucket index, count)
    tokens_sum: float
    concurrency: tuple[tuple[int, int], ...]
    concurrency_sum: float

    @classmethod
    def of(cls, tokens: Histogram, concurrency: Histogram) -> RequestSizes | None:
        """The run's histograms; None when it had no request."""
        if not tokens.count and not concurrency.count:
            return None
        return cls(_sparse(tokens), tokens.sum, _sparse(concurrency), concurrency.sum)

    def add_to(self, tokens: Histogram, concurrency: Histogram) -> None:
        for h, items, total in (
            (tokens, self.tokens, self.tokens_sum),
            (concurrency, self.concurrency, self.concurrency_sum),
        ):
            for i, n in items:
                h.counts[i] += n
                h.count += n
            h.sum += total


def _sparse(h: Histogram) -> tuple[tuple[int, int], ...]:
    return tuple((i, n) for i, n in enumerate(h.counts) if n)


@dataclass
class RequestSummary:
    """What the requests of a history asked of the pool, and the pool that would have held them."""

    requests: int
    tokens_p50: float | None
    tokens_p90: float | None
    tokens_p99: float | None
    tokens_max: int  # the largest release line (exact)
    concurrency_p50: float | None
    concurrency_p99: float | None
    concurrency_max: int | None  # the highest bucket hit (exact up to 8 at once)
    pool_cells: int | None  # the largest pool of the runs
    pool_needed: int | None  # p99 request x p99 in flight together

    @property
    def undersized(self) -> bool | None:
        """The pool could not hold the p99 request times the p99 concurrency (None: unknown)."""
        if self.pool_needed is None or self.pool_cells is None:
            return None
        return self.pool_needed > self.pool_cells


def summarize(tokens: Histogram, concurrency: Histogram, tokens_max: int, pool_cells: int | None) -> RequestSummary:
    """The summary of summed histograms (quantiles as PromQL's histogram_quantile computes them).

    >>> t, c = Histogram(REQUEST_TOKEN_BUCKETS), Histogram(CONCURRENCY_BUCKETS)
    >>> for n in [3000] * 90 + [150_000] * 10:
    ...     t.observe(n)
    >>> for k in [1] * 60 + [2] * 30 + [3] * 10:
    ...     c.observe(k)
    >>> s = summarize(t, c, 159_069, 262_144)
    >>> round(s.tokens_p99), s.concurrency_max, s.pool_needed, s.undersized
    (159069, 3, 461300, True)
    """
    top = max((i for i, n in enumerate(concurrency.counts) if n), default=None)
    most = None if top is None else int(concurrency.bounds[min(top, len(concurrency.bounds) - 1)])

    def q(h: Histogram, p: float, cap: float | None) -> float | None:
        """The interpolated quantile, never above the largest value seen (which is known exactly here)."""
        v = h.quantile(p)
        return v if v is None or cap is None else min(v, cap)

    p99, c99 = q(tokens, 0.99, tokens_max or None), q(concurrency, 0.99, most)
    return RequestSummary(
        requests=tokens.count,
        tokens_p50=q(tokens, 0.5, tokens_max or None),
        tokens_p90=q(tokens, 0.9, tokens_max or None),
        tokens_p99=p99,
        tokens_max=tokens_max,
        concurrency_p50=q(concurrency, 0.5, most),
        concurrency_p99=c99,
        concurrency_max=most,
        pool_cells=pool_cells,
        pool_needed=None if p99 is None or c99 is None else round(p99 * c99),
    )
