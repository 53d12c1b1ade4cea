"""`/`: the status document (`status.document`) as a page a person reads at a glance. Pure.

No script and nothing fetched from elsewhere: one inline stylesheet allowed by its hash in the page's
Content-Security-Policy (`CSP`; everything else `'none'`), inline SVG charts styled by class, a meta
refresh every `REFRESH_SECONDS`. Dark or light by the system's setting (`prefers-color-scheme`). Every
text that comes from outside (client, model and file names, log text, error messages) goes through
`html.escape`, so `<script>` in a name is shown, never run.
"""

from __future__ import annotations

import base64
import hashlib
import html
from collections.abc import Sequence

from exporter.status.charts import bar_chart, line_chart, pool_bar

REFRESH_SECONDS = 5

STYLE = """
:root{color-scheme:light dark;--bg:#fff;--fg:#1b1b1b;--mute:#666;--line:#ddd;--ok:#2e7d32;--warn:#b26a00;
--bad:#c62828;--proc:#1565c0;--idle:#90a4ae;--free:#eceff1;--chart:#1565c0}
@media (prefers-color-scheme:dark){:root{--bg:#121417;--fg:#e6e6e6;--mute:#9aa0a6;--line:#333;--ok:#66bb6a;
--warn:#ffb74d;--bad:#ef5350;--proc:#64b5f6;--idle:#607d8b;--free:#263238;--chart:#64b5f6}}
body{background:var(--bg);color:var(--fg);font:15px/1.45 system-ui,sans-serif;margin:0 auto;max-width:60rem;
padding:.8rem}
h1{font-size:1.2rem;margin:.2rem 0}h2{font-size:1.1rem;margin:1.2rem 0 .3rem;border-top:1px solid var(--line);
padding-top:.8rem}h3{font-size:.95rem;margin:.8rem 0 .2rem}
.mute{color:var(--mute)}.badge{font-weight:700;padding:0 .35rem;border-radius:.25rem;color:#fff}
.up{background:var(--ok)}.loading{background:var(--warn)}.down,.unknown{background:var(--bad)}
.bad{color:var(--bad)}.warn{color:var(--warn)}ul{margin:.2rem 0;padding-left:1.2rem}
table{border-collapse:collapse}td,th{padding:.1rem .6rem .1rem 0;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums}svg{display:block;max-width:100%;height:auto}
.charts{display:flex;flex-wrap:wrap;gap:.8rem}.charts figure{margin:0}.charts figcaption{font-size:.85rem}
svg .proc{fill:var(--proc)}svg .idle{fill:var(--idle)}svg .free{fill:var(--free)}svg .limit{stroke:var(--bad);
stroke-width:2}svg .over{fill:var(--bad)}svg .series{fill:none;stroke:var(--chart);stroke-width:1.5}
svg .bars{fill:var(--bad)}svg .axis{stroke:var(--line)}svg text{fill:var(--mute);font:11px system-ui,sans-serif}
"""

#: The page's Content-Security-Policy: nothing but its own stylesheet (by hash); no script at all.
STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
CSP = (
    f"default-src 'none'; style-src 'sha256-{STYLE_HASH}'; img-src 'none'; script-src 'none'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def e(value: object) -> str:
    """Text from outside, escaped for HTML (quotes too)."""
    return html.escape(str(value), quote=True)


def when(t: float | None, now: float) -> str:
    """`05:53:12 UTC (42 s ago)`; the date too when it is not today's."""
    if t is None:
        return "before the exporter started"
    day, secs = divmod(int(t), 86400)
    h, rest = divmod(secs, 3600)
    clock = f"{h:02d}:{rest // 60:02d}:{rest % 60:02d} UTC"
    if day != int(now) // 86400:
        y, m, d = civil_date(day)
        clock = f"{y:04d}-{m:02d}-{d:02d} {clock}"
    return f"{clock} ({ago(now - t)})"


def civil_date(days: int) -> tuple[int, int, int]:
    """(year, month, day) of a day counted from 1970-01-01 (proleptic Gregorian; no clock, no time zone).

    >>> civil_date(0), civil_date(20791)
    ((1970, 1, 1), (2026, 12, 4))
    """
    z = days + 719468
    era = (z if z >= 0 else z - 146096) // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (m <= 2), m, d


def ago(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 120:
        return f"{s} s ago"
    if s < 7200:
        return f"{s // 60} min ago"
    return f"{s // 3600} h ago"


def size(n: object) -> str:
    """Bytes in words: `1.5 GiB`."""
    if not isinstance(n, (int, float)):
        return "unknown"
    v = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} TiB"


def plural(n: object, one: str, many: str) -> str:
    """`1 crash`, `3 crashes`."""
    return f"{n} {one if n == 1 else many}"


def cells(n: object) -> str:
    return f"{n:,}" if isinstance(n, int) else "unknown"


def pct(r: object) -> str:
    return f"{r * 100:.1f} %" if isinstance(r, (int, float)) else "unknown"


def page(doc: dict[str, object]) -> str:
    """The whole page."""
    now = float(doc["time"])  # type: ignore[arg-type]
    servers: Sequence[dict[str, object]] = doc["servers"]  # type: ignore[assignment]
    demo = "<p><strong>Demo mode</strong>: replaying two recorded llama-server logs.</p>" if doc.get("demo") else ""
    body = "\n".join(_server(s, now) for s in servers) or "<p>No server followed.</p>"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<meta http-equiv="refresh" content="{REFRESH_SECONDS}">
<title>llamacpp-exporter</title><style>{STYLE}</style></head>
<body>
<h1>llamacpp-exporter {e(doc["version"])}</h1>
<p class="mute">{e(when(now, now).split(" (")[0])}; this page reloads every {REFRESH_SECONDS} s.
<a href="metrics">/metrics</a> · <a href="api/status">/api/status</a> · <a href="healthz">/healthz</a></p>
{demo}
{body}
</body></html>
"""


def _server(s: dict[str, object], now: float) -> str:
    state = str(s["state"])
    build = f"b{s['build']}" if s.get("build") is not None else "build unknown"
    since = f", since {e(when(s['since'], now))}" if s.get("since") else ""  # type: ignore[arg-type]
    head = (
        f'<h2 id="{e(s["name"])}">{e(s["name"])} <span class="badge {e(state)}">{e(state)}</span></h2>\n'
        f"<p>{e(build)} · model {e(s.get('model') or 'unknown')}{since}"
        f' <span class="mute">(state from {e(s["state_source"])})</span></p>'
    )
    if s.get("start_error"):
        head += f'<p class="bad">{e(s["start_error"])}</p>'
    parts = [head, _sources(s), _pool(s), _incidents(s, now), _memory(s), _guard(s), _history(s)]
    return '<section class="server">\n' + "\n".join(p for p in parts if p) + "\n</section>"


def _sources(s: dict[str, object]) -> str:
    items: list[str] = []
    lg = s.get("log")
    if isinstance(lg, dict):
        path = f" <code>{e(lg['path'])}</code>" if lg.get("path") else ""
        if not lg.get("up"):
            state = '<span class="bad">not read</span>'
        elif lg.get("understood") is False:
            state = '<span class="bad">not understood</span>'
        else:
            state = "followed"
        extra = [
            f"{lg[k]} {word}"
            for k, word in (("truncations", "truncations"), ("rotations", "rotations"), ("lost_bytes", "bytes lost"))
            if lg.get(k)
        ]
        why = f': <span class="bad">{e(lg["problem"])}</span>' if lg.get("problem") else ""
        items.append(f"log{path}: {state}{why}" + (f" ({e(', '.join(extra))})" if extra else ""))
    sources = s.get("sources")
    if isinstance(sources, dict):
        for name, r in sorted(sources.items()):
            if r.get("up"):
                items.append(f"{e(name)}: up")
            else:
                why = f": {e(r['error'])}" if r.get("error") else ""
                items.append(f'{e(name)}: <span class="bad">down</span>{why}')
    return "<h3>Sources</h3><ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>" if items else ""


def _pool(s: dict[str, object]) -> str:
    p = s["pool"]
    assert isinstance(p, dict)
    slots = s["slots"]
    assert isinstance(slots, list)
    ratio = p.get("usage_ratio")
    cls = "bad" if isinstance(ratio, float) and ratio > p["saturated_ratio"] else ""
    lines = [
        f'<p><span class="{cls}">{cells(p["used"])} of {cells(p["capacity"])} cells ({pct(ratio)})</span>'
        f' <span class="mute">(pool from {e(p["capacity_source"])})</span></p>',
        pool_bar(slots, p["capacity"], p["saturated_ratio"]),
    ]
    facts = []
    if p.get("overcommit_ratio") is not None:
        facts.append(f"overcommit {p['overcommit_ratio']:.2f}")
    demand = p.get("demand")
    if isinstance(demand, dict):
        facts.append(f"demand in flight {cells(demand['prompt'])} cells (at most {cells(demand['max'])})")
    if p.get("full_eta_seconds") is not None:
        facts.append(f'<span class="warn">full in {p["full_eta_seconds"]:.0f} s</span> at the current speed')
    if p.get("in_cascade"):
        facts.append('<span class="bad">retry cascade in progress</span>')
    if facts:
        lines.append("<p>" + " · ".join(facts) + "</p>")
    if slots:
        rows = "".join(
            f'<tr><td>slot {sl["slot"]}</td><td class="n">{cells(sl["tokens"])}</td>'
            f"<td>{'processing' if sl['processing'] else 'idle'}</td></tr>"
            for sl in slots
        )
        lines.append(f"<table><tr><th>slot</th><th>cells</th><th></th></tr>{rows}</table>")
    return "<h3>KV pool</h3>" + "\n".join(lines)


def _incidents(s: dict[str, object], now: float) -> str:
    incidents = s["incidents"]
    assert isinstance(incidents, list)
    counters = s["counters"]
    assert isinstance(counters, dict)
    figures = (
        plural(counters["requests_aborted"], "request", "requests") + " aborted",
        plural(counters["kv_retries"], "retry", "retries"),
        plural(counters["server_crashes"], "crash", "crashes"),
        plural(counters["server_starts"], "start", "starts"),
    )
    total = f'<p class="mute">since the exporter started: {", ".join(figures)}</p>'

    if not incidents:
        return "<h3>Last incidents</h3><p>None since the exporter started.</p>" + total
    items = []
    for i in incidents:
        cls = "bad" if i["kind"] in ("overflow", "crash") else "warn"
        still = " (still settling)" if i["open"] else ""
        items.append(
            f'<li><span class="{cls}">{e(i["summary"])}</span>{still} '
            f'<span class="mute">{e(when(i["time"], now))}</span></li>'
        )
    return "<h3>Last incidents</h3><ul>" + "".join(items) + "</ul>" + total


def _memory(s: dict[str, object]) -> str:
    m = s["memory"]
    assert isinstance(m, dict)
    rows = []
    for g in m["gpus"]:
        own = f", llama-server {size(g['server_bytes'])}" if g.get("server_bytes") is not None else ""
        rows.append(f"GPU {g['gpu']} {e(g['name'])}: {size(g['free_bytes'])} free of {size(g['total_bytes'])}{own}")
    for key, word in (
        ("server_rss_bytes", "llama-server resident"),
        ("host_available_bytes", "host RAM available"),
        ("kv_cache_bytes", "KV cache"),
        ("checkpoint_bytes", "context checkpoints (host RAM)"),
        ("prompt_cache_bytes", "prompt cache (host RAM)"),
    ):
        if m.get(key) is not None:
            rows.append(f"{word}: {size(m[key])}")
    if m.get("prompt_cache_limit_bytes") is not None:
        rows.append(f"prompt cache limit: {size(m['prompt_cache_limit_bytes'])}")
    elif m.get("prompt_cache_unlimited"):
        rows.append("prompt cache limit: none")
    if not rows:
        return ""
    return "<h3>Memory</h3><ul>" + "".join(f"<li>{r}</li>" for r in rows) + "</ul>"


def _guard(s: dict[str, object]) -> str:
    g = s.get("guard")
    if not isinstance(g, dict):
        return ""
    rows = [f"{e(k.replace('_', ' '))}: {e(v)}" for k, v in g.items() if not isinstance(v, dict)]
    holders = g.get("pool_by_client")
    if isinstance(holders, dict) and holders:
        rows.append(
            "who holds the pool: "
            + ", ".join(f"{e(c)} {cells(n)} cells" for c, n in sorted(holders.items(), key=lambda kv: -kv[1]))
        )
    return "<h3>Guard</h3><ul>" + "".join(f"<li>{r}</li>" for r in rows) + "</ul>"


def _history(s: dict[str, object]) -> str:
    h = s.get("history")
    if not isinstance(h, dict) or not h.get("t"):
        return ""
    t = h["t"]
    step = h["step_seconds"]
    figures = [
        ("pool fill", line_chart(t, h["pool_usage_ratio"], top=1.0, limit=0.9, label="pool fill", fmt=pct)),
        ("free VRAM", line_chart(t, h["gpu_free_bytes"], top=None, limit=None, label="free VRAM", fmt=size)),
        ("requests aborted", bar_chart(t, h["requests_aborted"], label="requests aborted")),
    ]
    span = f"the last {len(t) * step / 60:.0f} min, a point every {step:.0f} s"
    return (
        f'<h3>History <span class="mute">({e(span)})</span></h3><div class="charts">'
        + "".join(f"<figure>{svg}<figcaption>{e(name)}</figcaption></figure>" for name, svg in figures)
        + "</div>"
    )
