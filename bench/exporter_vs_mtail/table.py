"""The benchmark's numbers and its table: a measured quantity with its median and range, paired ratios,
percentiles, and the rows printed at the end."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


@dataclass
class Stat:
    """A measured quantity: its samples and how to print one."""

    values: list[float]
    fmt: str = "{:.3g}"

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def __str__(self) -> str:
        if not self.values:
            return "n/a"
        med = self.fmt.format(self.median)
        if len(self.values) == 1:
            return med
        return f"{med} [{self.fmt.format(min(self.values))}-{self.fmt.format(max(self.values))}]"


def ratio(a: Stat | None, b: Stat | None) -> Stat | None:
    """Paired ratios a_i / b_i."""
    if a is None or b is None or not a.values or len(a.values) != len(b.values):
        return None
    return Stat([x / y for x, y in zip(a.values, b.values, strict=True) if y], "{:.2f}x")


@dataclass
class Row:
    section: str
    measure: str
    exporter: Stat | str | None
    mtail: Stat | str | None = None
    ratio: Stat | None = None
    target: str = ""
    met: bool | None = None


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *args: object, **kwargs: object) -> None:
        self.rows.append(Row(*args, **kwargs))  # type: ignore[arg-type]

    def print(self) -> None:
        header = ("", "measure", "exporter", "mtail", "exporter/mtail", "target", "met")
        cells = [header]
        for r in self.rows:
            met = "" if r.met is None else ("yes" if r.met else "NO")
            cells.append(
                (
                    r.section,
                    r.measure,
                    str(r.exporter) if r.exporter is not None else "",
                    str(r.mtail) if r.mtail is not None else "",
                    str(r.ratio) if r.ratio is not None else "",
                    r.target,
                    met,
                )
            )
        widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
        for n, c in enumerate(cells):
            print("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())
            if n == 0:
                print("  ".join("-" * w for w in widths))
        for note in self.notes:
            print(f"* {note}")
