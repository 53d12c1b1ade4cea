"""The one histogram type: what a Prometheus histogram exports, kept as plain counts. Pure.

Every histogram of the exporter and of the guard is one: the request sizes and concurrency
(`exporter.model.request_sizes`), prompt evaluation times (`ServerState.prompt_eval_seconds`), the
guard's queue waits and prompt sizes (`exporter.guard.books`). Buckets are fixed per family, so that
histograms of several servers (and `diagnose`'s runs) add up.

    >>> h = Histogram((1.0, 2.5, 5.0))
    >>> for v in (0.5, 1.0, 3, 7):
    ...     h.observe(v)
    >>> h.counts, h.count, h.sum
    ([2, 0, 1, 1], 4, 11.5)
    >>> h.buckets()
    [('1.0', 2.0), ('2.5', 2.0), ('5.0', 3.0), ('+Inf', 4.0)]
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field


@dataclass
class Histogram:
    """Counts per bucket (not cumulative), their sum and count.

    A value falls in the first bucket whose upper bound it does not pass (`le`, as Prometheus counts),
    past the last bound in `+Inf`. Values are numbers the model has bounded (never NaN).
    """

    bounds: tuple[float, ...]  # upper bounds, ascending
    counts: list[int] = field(default_factory=list)  # one per bound, then +Inf
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        # bisect_left: the first bound >= value (an index past the bounds is the +Inf bucket).
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def add(self, other: Histogram) -> None:
        """Add another histogram with the same buckets (diagnose sums the runs of a history)."""
        for i, n in enumerate(other.counts):
            self.counts[i] += n
        self.sum += other.sum
        self.count += other.count

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, count of values at or below it), +Inf last: Prometheus' `_bucket` series."""
        out, total = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out

    def buckets(self) -> list[tuple[str, float]]:
        """`cumulative()` as `HistogramMetricFamily` takes it: each bound as written (`str`), `+Inf` last."""
        return [("+Inf" if bound == math.inf else str(bound), float(n)) for bound, n in self.cumulative()]

    def quantile(self, q: float) -> float | None:
        """The q-quantile as PromQL's `histogram_quantile` gives it (linear within a bucket); None if empty."""
        if self.count == 0:
            return None
        rank = q * self.count
        lower, below = 0.0, 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            if below + n >= rank and n:
                return lower + (bound - lower) * (rank - below) / n
            lower, below = bound, below + n
        return self.bounds[-1]  # in the +Inf bucket: the highest bound, as histogram_quantile answers
