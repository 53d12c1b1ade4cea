"""`diagnose --html FILE`: the report as one self-contained page, with charts drawn by matplotlib.

The page has no outside references (no scripts, styles or fonts to fetch): each chart is inline SVG
with its text drawn as paths. matplotlib is an optional extra (``html``; exporter.install_hint says how to
add it) so that the exporter's own install stays small; `render_html` raises `HtmlUnavailable` without it.

What it draws:

* the history: one bar per run (by the journal's clock, the files' times, or in order), coloured by
  how it ended, with each run's failures marked;
* for each run shown in detail, the tokens each slot held over time (stacked: their sum is the pool's
  fill), the pool's capacity, every failure (a red line) and a crash or kill (a red cross at the end).
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from exporter.diagnose.first_tokens import first_token_prose, first_token_table
from exporter.diagnose.render import render_text
from exporter.diagnose.report import ENDINGS, FirstTokens, Report, RunReport, RunSummary
from exporter.install_hint import extra_install_hint

if TYPE_CHECKING:
    from exporter.diagnose.trace import PoolSeries

#: Colours of how runs ended (the timeline) and of failures.
_ENDING_COLOURS = {
    "clean": "#2ca02c",
    "failed_start": "#ff7f0e",
    "died_mid_request": "#d62728",
    "died_idle": "#e377c2",
    "log_ends_mid_request": "#8c564b",
    "log_ends_idle": "#7f7f7f",
    "log_ends_starting": "#bcbd22",
}
_FAILURE = "#d62728"
_STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 72em; color: #222; background: #fff; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; }
figure { margin: 0.5em 0; } figure svg { width: 100%; height: auto; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; font-size: 0.85em; }
.ending { font-weight: normal; color: #555; }
"""


class HtmlUnavailable(Exception):
    """matplotlib is not installed (the `html` extra)."""


def _figure(width: float, height: float) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise HtmlUnavailable(f"--html needs matplotlib, the html extra: {extra_install_hint('html')}") from None
    return Figure(figsize=(width, height), layout="constrained")


def _svg(fig: Any) -> str:
    """The figure as an inline <svg> element (text as paths: no font needed to show it)."""
    from matplotlib import rc_context

    buf = io.StringIO()
    with rc_context({"svg.fonttype": "path"}):  # the default, said: the page must need no font
        fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    return svg[svg.index("<svg") :]


#: The history chart draws at most this many runs (the latest).
TIMELINE_RUNS = 200


def _timeline(history: Sequence[RunSummary]) -> str:
    """One bar per run, coloured by its ending, with its failures in red (the latest TIMELINE_RUNS)."""
    every = [s for s in history if s.same_as is None]
    runs = every[-TIMELINE_RUNS:]
    dated = all(s.started_at is not None and s.ended_at is not None for s in runs)
    fig = _figure(10, 1.2 + 0.18 * min(len(runs), 40))
    ax = fig.add_subplot()
    for row, s in enumerate(runs):
        if dated:  # matplotlib's dates are days since 1970
            assert s.started_at is not None and s.ended_at is not None
            start, width = s.started_at / 86400, max(s.ended_at - s.started_at, 1.0) / 86400
        else:
            start, width = float(row), 0.8
        ax.barh(row, width, left=start, color=_ENDING_COLOURS[s.ending], height=0.7)
        # A run of seconds in a history of days is thinner than a pixel: a dot marks where it is.
        ax.plot([start], [row], marker="o", color=_ENDING_COLOURS[s.ending], markersize=6)
        if s.failures:
            ax.plot([start + width], [row], marker="v", color=_FAILURE, markersize=7)
            ax.annotate(f"{s.failures} failed", (start + width, row), xytext=(6, -3), textcoords="offset points")
    ax.set_yticks(range(len(runs)), [f"run {s.index}" for s in runs] if len(runs) <= 40 else [""] * len(runs))
    ax.invert_yaxis()
    if dated:
        from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

        locator = AutoDateLocator()  # type: ignore[no-untyped-call]
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    else:
        ax.set_xlabel("runs in order (no wall-clock times in these logs)")
        ax.set_xticks([])
    handles = [_patch(_ENDING_COLOURS[how], ENDINGS[how][0]) for how in ENDINGS if any(s.ending == how for s in runs)]
    ax.legend(handles=handles, loc="upper right", fontsize="small")
    ax.set_title(
        "Every run, and how it ended"
        if len(runs) == len(every)
        else f"The last {len(runs):,} of {len(every):,} runs, and how they ended"
    )
    return _svg(fig)


def _patch(colour: str, label: str) -> Any:
    from matplotlib.patches import Patch

    return Patch(color=colour, label=label)


def _run_chart(run: RunReport, series: PoolSeries | None) -> str | None:
    """The tokens each slot held over the run (stacked), the pool, its failures and how it ended."""
    if series is None or not (series.x or series.failures):
        return None
    # What --json gives as the run's series: the log's own x (seconds since the server started, the
    # text's origin), each failure at the cells the text counts.
    plotted = series.as_json()
    xs, stacks = plotted["x"], plotted["slots"]
    width = len(stacks)
    fig = _figure(10, 3)
    ax = fig.add_subplot()
    layers = ax.stackplot(xs, stacks, labels=[f"slot {i}" for i in range(width)], step="post", alpha=0.85)
    # Each failure's cells as the text counts them (the release lines), as a stacked bar: in the steps
    # they last only until the next line, too short to see on a run of minutes.
    span = (max(xs) - min(xs)) if len(xs) > 1 else 1.0
    for fx in plotted["failures"]:
        i = max(k for k, x in enumerate(xs) if x == fx)
        bottom = 0
        for layer, stack in zip(layers, stacks, strict=True):
            if stack[i]:
                ax.bar(
                    fx,
                    stack[i],
                    width=span * 0.02 or 1.0,
                    bottom=bottom,
                    color=layer.get_facecolor()[0],
                    align="edge",
                    linewidth=0,
                )
            bottom += stack[i]
    pool = run.ending.pool_capacity_tokens or run.configuration.pool_cells
    if pool:
        ax.axhline(pool, color="#222", linestyle="--", linewidth=1, label=f"pool {pool:,}")
    for f in run.failures:
        at = f.line if series.by_line else f.elapsed_s
        if at is not None:
            ax.axvline(at, color=_FAILURE, linewidth=1.5)
            ax.annotate(
                f"failure {f.number}: {f.aborted_requests} aborted, {f.tokens_sum:,} held",
                (at, pool or 0),
                color=_FAILURE,
                xytext=(-3, -12),
                textcoords="offset points",
                fontsize="small",
                ha="right",
            )
    if run.ending.how in ("died_mid_request", "died_idle", "log_ends_mid_request"):
        ax.plot(
            [xs[-1]],
            [sum(s[-1] for s in stacks)],
            marker="X",
            color=_FAILURE,
            markersize=12,
            label=ENDINGS[run.ending.how][0],
        )
    ax.set_xlabel("line" if series.by_line else "seconds since the server started (the log's time stamps)")
    ax.set_ylabel("tokens held")
    peak = max((sum(col) for col in zip(*stacks, strict=True)), default=0)
    ax.set_ylim(bottom=0, top=max(peak, pool or 0) * 1.12 or None)
    if not series.by_line:
        ax.set_xlim(left=0)  # the text's origin: the server's start
    ax.legend(loc="upper left", fontsize="small", ncols=min(width + 2, 6))
    return _svg(fig)


def _first_tokens_table(ft: FirstTokens) -> str:
    """The run's first tokens by cache outcome, as the text gives them."""
    e = html.escape
    header, *rows = first_token_table(ft)
    cells = [f"<tr>{''.join(f'<th>{e(c)}</th>' for c in header)}</tr>"]
    cells.extend(f"<tr>{''.join(f'<td>{e(c)}</td>' for c in row)}</tr>" for row in rows)
    prose = "".join(f"<p>{e(line)}</p>" for line in first_token_prose(ft))
    return f"<h3>First tokens by cache outcome</h3><table>{''.join(cells)}</table>{prose}"


def render_html(report: Report) -> str:
    """The whole report as one self-contained HTML page (raises `HtmlUnavailable` without matplotlib)."""
    e = html.escape
    title = f"llama-server post-mortem: {report.file}"
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{e(title)}</h1>",
    ]
    text = render_text(report)
    summary = text.split("\n\nRun ", 1)[0]
    parts.append(f"<pre>{e(summary)}</pre>")
    if len([s for s in report.history if s.same_as is None]) > 1:
        parts.append(f"<figure>{_timeline(report.history)}</figure>")
    for run in report.runs:
        where = f"{run.file}, " if len(report.files) > 1 else ""
        head = f"Run {run.index} ({where}lines {run.first_line:,}-{run.last_line:,})"
        parts.append(f'<h2>{e(head)} <span class="ending">{e(ENDINGS[run.ending.how][1])}</span></h2>')
        chart = _run_chart(run, report.series.get(run.index))
        parts.append(f"<figure>{chart}</figure>" if chart else "<p>No request in this run: nothing to draw.</p>")
        if run.first_tokens is not None:
            parts.append(_first_tokens_table(run.first_tokens))
    details = re.split(r"\n(?=Run \d)", text)[1:]
    if details:
        parts.append("<details><summary>Each run in detail (the text report)</summary>")
        parts.append(f"<pre>{e(chr(10).join(details))}</pre></details>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
