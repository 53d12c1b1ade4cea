"""The last hour of one server at a glance: pool fill, free VRAM and aborted requests, in a fixed ring. Pure.

`History.add(t, …)` is called every `STEP_SECONDS` by the exporter's sampler (the time comes in with the
call); the ring keeps `POINTS` points per series in flat arrays of doubles, so its memory is fixed: 4 arrays
(time and three series) × `POINTS` × 8 bytes = 11,520 bytes per server (`RING_BYTES`), whatever runs. An
unknown value (no pool size yet, no GPU read) is NaN, and null in `/api/status`.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

#: Seconds between two points, and points kept: one hour.
STEP_SECONDS = 10.0
POINTS = 360
#: The series kept, in the order of `History.add`'s arguments.
SERIES = ("pool_usage_ratio", "gpu_free_bytes", "requests_aborted")
#: Bytes the ring's arrays hold per server (time and each series, doubles).
RING_BYTES = (1 + len(SERIES)) * POINTS * 8


@dataclass(frozen=True)
class HistorySnapshot:
    """The ring's points, oldest first (None: unknown)."""

    step_seconds: float
    t: tuple[float, ...]
    series: dict[str, tuple[float | None, ...]]


class History:
    """A fixed ring of `points` samples of the series in `SERIES`."""

    def __init__(self, points: int = POINTS, step_seconds: float = STEP_SECONDS) -> None:
        self.step_seconds = step_seconds
        self._t = array("d", [math.nan]) * points
        self._values = [array("d", [math.nan]) * points for _ in SERIES]
        self._next = 0  # where the next point goes
        self._count = 0

    def add(self, t: float, pool_ratio: float | None, gpu_free: float | None, aborted: float | None) -> None:
        """One point at `t` (seconds since the epoch)."""
        i = self._next
        self._t[i] = t
        for arr, v in zip(self._values, (pool_ratio, gpu_free, aborted), strict=True):
            arr[i] = math.nan if v is None else float(v)
        self._next = (i + 1) % len(self._t)
        self._count = min(self._count + 1, len(self._t))

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        """Bytes the ring's arrays hold (`RING_BYTES` at the default size)."""
        return sum(len(a) * a.itemsize for a in (self._t, *self._values))

    def snapshot(self) -> HistorySnapshot:
        """The points, oldest first."""
        n, size = self._count, len(self._t)
        order = [(self._next - n + k) % size for k in range(n)]
        series = {
            name: tuple(None if math.isnan(arr[i]) else arr[i] for i in order)
            for name, arr in zip(SERIES, self._values, strict=True)
        }
        return HistorySnapshot(self.step_seconds, tuple(self._t[i] for i in order), series)
