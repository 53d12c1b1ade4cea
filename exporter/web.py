"""aiohttp server: `/metrics`, a landing page at `/`, and `/healthz` for the sidecar's own probes."""

from __future__ import annotations

import html
import json
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from exporter import __version__

BeforeScrape = Callable[[], Awaitable[None]]

_LANDING = """<!doctype html>
<html><head><meta charset="utf-8"><title>llamacpp-exporter</title></head>
<body>
<h1>llamacpp-exporter {version}</h1>
<p>Prometheus exporter for llama.cpp's llama-server: slots, shared KV pool, retry cascades.</p>
<p>Log: <code>{log}</code></p>
<ul><li><a href="metrics">/metrics</a></li><li><a href="healthz">/healthz</a></li></ul>
</body></html>
"""


def make_app(
    registry: CollectorRegistry,
    *,
    log_description: str,
    health: Callable[[], dict[str, object]],
    before_scrape: BeforeScrape | None = None,
) -> web.Application:
    """Build the application. `before_scrape` runs live reads (HTTP, NVML) before the registry is rendered."""

    async def metrics(request: web.Request) -> web.Response:
        if before_scrape is not None:
            await before_scrape()
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encoder(registry)
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = content_type
        return resp

    async def landing(request: web.Request) -> web.Response:
        page = _LANDING.format(version=html.escape(__version__), log=html.escape(log_description))
        return web.Response(text=page, content_type="text/html")

    async def healthz(request: web.Request) -> web.Response:
        body = health()
        status = 200 if body.get("status") == "ok" else 503
        return web.Response(text=json.dumps(body), content_type="application/json", status=status)

    app = web.Application()
    app.router.add_get("/", landing)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    return app


async def start_server(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Start serving `app`; the caller cleans up the returned runner."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host or None, port)
    await site.start()
    return runner
