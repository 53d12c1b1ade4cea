"""Small inline SVG charts for the status page: the pool as a bar of stacked slots, and the last hour. Pure.

Colours come from the page's stylesheet by class (`proc`, `idle`, `limit`, `series`, `bars`): no style
attribute, so the page's Content-Security-Policy allows no inline style but its own stylesheet.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

BAR_W, BAR_H = 600, 26
CHART_W, CHART_H = 280, 70


def _f(v: float) -> str:
    return f"{v:.1f}"


def pool_bar(slots: Sequence[dict[str, object]], capacity: object, limit: float) -> str:
    """The pool as a bar: each slot's cells a segment (processing or idle), the red line at `limit` of the pool;
    what overflows the pool is drawn past its end in red."""
    if not isinstance(capacity, int) or capacity <= 0:
        return '<p class="mute">The pool size is not known yet.</p>'
    held = sum(int(s["tokens"]) for s in slots)  # type: ignore[call-overload]
    scale = BAR_W / max(capacity, held)
    out = [
        f'<svg class="pool" viewBox="0 0 {BAR_W} {BAR_H + 14}" width="{BAR_W}" height="{BAR_H + 14}" role="img">',
        f"<title>{held} of {capacity} cells</title>",
        f'<rect class="free" x="0" y="0" width="{_f(capacity * scale)}" height="{BAR_H}"/>',
    ]
    x = 0.0
    for s in slots:
        n = int(s["tokens"])  # type: ignore[call-overload]
        if n <= 0:
            continue
        w = n * scale
        cls = "proc" if s["processing"] else "idle"
        state = "processing" if s["processing"] else "idle"
        out.append(
            f'<rect class="{cls}" x="{_f(x)}" y="0" width="{_f(max(w - 1, 0.5))}" height="{BAR_H}">'
            f"<title>slot {int(s['slot'])}: {n} cells, {state}</title></rect>"  # type: ignore[call-overload]
        )
        x += w
    if held > capacity:
        out.append(
            f'<rect class="over" x="{_f(capacity * scale)}" y="0" width="{_f((held - capacity) * scale)}" '
            f'height="{BAR_H}"/>'
        )
    lx = _f(capacity * limit * scale)
    out.append(f'<line class="limit" x1="{lx}" y1="0" x2="{lx}" y2="{BAR_H + 4}"/>')
    out.append(f'<text x="{lx}" y="{BAR_H + 13}" text-anchor="middle">{limit * 100:.0f} %</text>')
    out.append("</svg>")
    return "".join(out)


def _points(t: Sequence[float], values: Sequence[float | None], top: float) -> list[list[tuple[float, float]]]:
    """Runs of known points, in chart coordinates (a gap where a value is unknown)."""
    t0, t1 = t[0], t[-1]
    span = (t1 - t0) or 1.0
    runs: list[list[tuple[float, float]]] = [[]]
    for ti, v in zip(t, values, strict=True):
        if v is None:
            if runs[-1]:
                runs.append([])
            continue
        x = (ti - t0) / span * (CHART_W - 2) + 1
        y = CHART_H - 1 - min(max(v / top, 0.0), 1.0) * (CHART_H - 2) if top > 0 else CHART_H - 1
        runs[-1].append((x, y))
    return [r for r in runs if r]


def line_chart(
    t: Sequence[float],
    values: Sequence[float | None],
    *,
    top: float | None,
    limit: float | None,
    label: str,
    fmt: Callable[[float], str] = lambda v: f"{v:.4g}",
) -> str:
    """A line over the ring's points, from 0 to `top` (None: the largest value); a red line at `limit`; the last
    value written in its corner (`fmt`)."""
    known = [v for v in values if v is not None]
    if not t or not known:
        return _unknown(label)
    scale_top = top if top is not None else (max(known) * 1.1 or 1.0)
    out = [
        f'<svg viewBox="0 0 {CHART_W} {CHART_H}" width="{CHART_W}" height="{CHART_H}" role="img">',
        f"<title>{html.escape(label)}: last {html.escape(fmt(known[-1]))}</title>",
        f'<line class="axis" x1="0" y1="{CHART_H - 0.5}" x2="{CHART_W}" y2="{CHART_H - 0.5}"/>',
        f'<text x="{CHART_W - 2}" y="{CHART_H - 4}" text-anchor="end">now {html.escape(fmt(known[-1]))}</text>',
    ]
    if limit is not None:
        y = CHART_H - 1 - limit / scale_top * (CHART_H - 2)
        out.append(f'<line class="limit" x1="0" y1="{_f(y)}" x2="{CHART_W}" y2="{_f(y)}"/>')
        # The line's value under it, at the left: the chart has no other axis.
        out.append(f'<text x="2" y="{_f(y + 10)}">{html.escape(fmt(limit))}</text>')
    for run in _points(t, values, scale_top):
        if len(run) == 1:
            run = [run[0], (run[0][0] + 1, run[0][1])]
        out.append('<polyline class="series" points="' + " ".join(f"{_f(x)},{_f(y)}" for x, y in run) + '"/>')
    out.append("</svg>")
    return "".join(out)


def bar_chart(t: Sequence[float], cumulative: Sequence[float | None], *, label: str) -> str:
    """Bars of the increase of a counter between points (requests aborted in each step)."""
    if not t:
        return _unknown(label)
    deltas: list[float] = []
    prev: float | None = None
    for v in cumulative:
        deltas.append(max(v - prev, 0.0) if v is not None and prev is not None else 0.0)
        prev = v if v is not None else prev
    top = max(deltas) or 1.0
    t0, span = t[0], (t[-1] - t[0]) or 1.0
    total = sum(deltas)
    out = [
        f'<svg viewBox="0 0 {CHART_W} {CHART_H}" width="{CHART_W}" height="{CHART_H}" role="img">',
        f"<title>{html.escape(label)}: {total:.0f} in this hour</title>",
        f'<line class="axis" x1="0" y1="{CHART_H - 0.5}" x2="{CHART_W}" y2="{CHART_H - 0.5}"/>',
    ]
    for ti, d in zip(t, deltas, strict=True):
        if d <= 0:
            continue
        x = (ti - t0) / span * (CHART_W - 4) + 1
        h = d / top * (CHART_H - 12)
        out.append(f'<rect class="bars" x="{_f(x)}" y="{_f(CHART_H - 1 - h)}" width="3" height="{_f(h)}"/>')
        out.append(f'<text x="{_f(x + 4)}" y="{_f(CHART_H - 3 - h)}">{d:.0f}</text>')
    out.append("</svg>")
    return "".join(out)


def _unknown(label: str) -> str:
    """A chart's place with nothing known to draw: the same size, so the charts beside it stay in line."""
    return (
        f'<svg viewBox="0 0 {CHART_W} {CHART_H}" width="{CHART_W}" height="{CHART_H}" role="img">'
        f"<title>{html.escape(label)}: not known in this hour</title>"
        f'<line class="axis" x1="0" y1="{CHART_H - 0.5}" x2="{CHART_W}" y2="{CHART_H - 0.5}"/>'
        f'<text x="{CHART_W / 2:g}" y="{CHART_H / 2:g}" text-anchor="middle">not known in this hour</text></svg>'
    )
