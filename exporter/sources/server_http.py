"""llama-server's own HTTP endpoints, read at scrape time: `/health`, `/slots`, `/props`, `/metrics`.

`ServerHttpReader.read()` fetches the four endpoints concurrently through one aiohttp session, with
one short timeout for all of them, and returns an immutable `HttpSnapshot`. Nothing raises: a server
that is down is `up=False`; an endpoint that is off (`/slots` 501 with `--no-slots`), missing (404
on old builds) or locked (401 without the API key) is recorded with its status, and the slots then
come from the log.

- `/health` (public): 200 = up; 503 `Loading model` = loading.
- `/slots`: per slot `n_prompt_tokens` (b9276+, the tokens the slot holds now, prompt + generated)
  and `is_processing`; `next_token` is an object before b6890 and an array of one object since.
- `/props`: `build_info` (`b11434-…`), `total_slots`, `default_generation_settings.n_ctx` (per slot).
- `/metrics` (llama-server's own, with `--metrics`; 501 without): `llamacpp:requests_deferred`, the
  requests waiting for a slot (what an inference gateway reads as the queue). Each figure read from it
  stands alone: one that is absent or not a count the server can have (`NaN`, `-1`, `2.5`, text) is
  left out and named in `HttpSnapshot.rejected`, and the source stays up.

Router mode (`llama-server --models-dir`): the router itself answers `/health` and `/models` (which
models are loaded); a child's endpoints are read through the router with `?model=NAME&autoload=false`
(`model=`), and only for a model `/models` lists as loaded. `autoload=false` matters: a plain
`/slots?model=NAME` makes the router load the model, and a scrape must never wake a model.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import urllib.parse
from collections.abc import Callable
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import aiohttp

from exporter.model.live import ENDPOINTS, ROUTER_ENDPOINTS, HttpSnapshot, LiveSlot, json_int, parse_slots

_BUILD = re.compile(r"^b?(\d+)")
#: A larger answer is not read (llama-server's /slots is ~1-2 KiB a slot; /props a few KiB).
MAX_BODY_BYTES = 16 << 20
# Statuses that say "this endpoint is not available here", not "the read failed".
_UNAVAILABLE = {404: "not found (older build)", 501: "disabled on the server"}


def redact_url(url: str) -> str:
    """`url` without the password of its user part (`http://user:***@host`), for pages and log lines."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.netloc.rpartition('@')[2]}"
    return parts._replace(netloc=netloc).geturl()


def redact(text: str, url: str) -> str:
    """`text` with the password of `url` (if it has one) replaced, wherever it appears."""
    try:
        password = urlsplit(url).password
    except ValueError:
        return text
    if not password:
        return text
    return text.replace(url, redact_url(url)).replace(password, "***")


def parse_models(body: object) -> dict[str, str]:
    """Model id → status value from a router's `/models` body; raises ValueError when it is not one."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise ValueError("expected an object with a data array")
    models: dict[str, str] = {}
    for item in data:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        status = item.get("status")
        value = status.get("value") if isinstance(status, dict) else None
        models[item["id"]] = value if isinstance(value, str) else "unknown"
    return models


class Props(NamedTuple):
    """What a `/props` body says, each field named as `HttpSnapshot`'s that holds it."""

    build: int | None
    total_slots: int | None
    n_ctx_slot: int | None  # default_generation_settings.n_ctx: per slot
    model: str | None


def parse_props(body: object) -> Props:
    """What a `/props` body says (`Props`)."""
    if not isinstance(body, dict):
        raise ValueError("expected a JSON object")
    build = None
    info = body.get("build_info")
    if isinstance(info, str) and (m := _BUILD.match(info)) and int(m[1]) > 0:
        build = int(m[1])
    settings = body.get("default_generation_settings")
    n_ctx = json_int(settings.get("n_ctx")) if isinstance(settings, dict) else None
    model = body.get("model_path")
    return Props(build, json_int(body.get("total_slots")), n_ctx, model if isinstance(model, str) and model else None)


class ServerHttpReader:
    """Reads `/health`, `/slots`, `/props` and `/metrics` (a router: `/health`, `/models`) through one aiohttp
    session (created on first use)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 2.0,
        model: str | None = None,
        router: Callable[[], bool] = lambda: False,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        # A router child's endpoints, through the router: never load the model (see the module's docstring).
        self._query = "?" + urllib.parse.urlencode({"model": model, "autoload": "false"}) if model else ""
        # Whether the server is a router now (its log says so): read its own endpoints (/health, /models) then.
        self.router = router
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._has_key = bool(api_key)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                # A fresh connection per request: a kept-alive one to a server that restarted meanwhile
                # would fail once and show a healthy server as down for a scrape.
                connector=aiohttp.TCPConnector(limit=8, force_close=True),
            )
        return self._session

    async def close(self) -> None:
        """Close the session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _get(self, endpoint: str) -> tuple[int, Any, str | None]:
        """(status, decoded JSON or None, error). Status 0 = no answer."""
        try:
            async with self._client().get(self.base_url + endpoint + self._query, allow_redirects=False) as resp:
                status = resp.status
                raw = bytearray()
                async for chunk in resp.content.iter_chunked(64 * 1024):
                    raw += chunk
                    if len(raw) > MAX_BODY_BYTES:
                        # Decoding it would stall every scrape and hold its size in memory.
                        return 0, None, f"{endpoint} answered more than {MAX_BODY_BYTES / 2**20:g} MiB"
        except asyncio.TimeoutError:
            return 0, None, f"no answer within {self.timeout:g}s"
        except aiohttp.ClientError as exc:
            return 0, None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace") if endpoint == "/metrics" else None
        return status, body, None

    async def read(self) -> HttpSnapshot:
        """Fetch the endpoints concurrently. Never raises (except cancellation)."""
        endpoints = ROUTER_ENDPOINTS if self.router() else ENDPOINTS
        results = await asyncio.gather(*(self._get(ep) for ep in endpoints))
        status: dict[str, int] = {}
        errors: dict[str, str] = {}
        bodies: dict[str, Any] = {}
        for ep, (code, body, error) in zip(endpoints, results, strict=True):
            status[ep] = code
            bodies[ep] = body
            if error is not None:
                errors[ep] = error
        health = status["/health"]
        up = health == 200
        loading = health == 503 and "loading" in _message(bodies["/health"]).lower()
        if health and not up and not loading:
            errors["/health"] = f"HTTP {health} {_message(bodies['/health'])}".strip()

        slots: tuple[LiveSlot, ...] | None = None
        build = total = n_ctx = None
        model: str | None = None
        models: dict[str, str] | None = None
        deferred: int | None = None
        rejected: dict[str, str] = {}
        for ep in endpoints[1:]:
            code = status[ep]
            if ep in errors or not up:
                if ep in errors and (loading or "/health" in errors):
                    del errors[ep]  # the server is loading or down: one error (or none) is enough
                continue
            if code == 200:
                try:
                    if ep == "/slots":
                        slots = parse_slots(bodies[ep])
                    elif ep == "/models":
                        models = parse_models(bodies[ep])
                    elif ep == "/metrics":
                        figures, rejected = parse_metrics(bodies[ep])
                        deferred = figures.get(REQUESTS_DEFERRED)
                    else:
                        build, total, n_ctx, model = parse_props(bodies[ep])
                except ValueError as exc:
                    errors[ep] = f"unexpected body: {exc}"
            elif code in _UNAVAILABLE:
                pass  # off or absent: the log is the source; the status metric says why
            elif code == 401:
                errors[ep] = (
                    "HTTP 401: the API key was rejected"
                    if self._has_key
                    else "HTTP 401: llama-server requires an API key; set --api-key or --api-key-file"
                )
            else:
                errors[ep] = f"HTTP {code} {_message(bodies[ep])}".strip()
        if health == 0 and "/health" in errors:
            errors["/health"] = f"llama-server not answering at {redact_url(self.base_url)}: {errors['/health']}"
        for ep, error in errors.items():  # a client error may quote the URL, credentials and all
            errors[ep] = redact(error, self.base_url)
        return HttpSnapshot(up, loading, status, errors, slots, build, total, n_ctx, model, models, deferred, rejected)


REQUESTS_DEFERRED = "llamacpp:requests_deferred"
#: The figures read from llama-server's own `/metrics`: each optional on its own (a bounded label set).
METRICS_FIGURES = (REQUESTS_DEFERRED,)
#: More requests than this waiting in one llama-server is no queue it can hold (each holds its prompt).
MAX_DEFERRED = 1 << 20
_SAMPLE = re.compile(
    r"^(" + "|".join(re.escape(f) for f in METRICS_FIGURES) + r")(?:\{[^}\n]*\})?[ \t]+(\S+)", re.MULTILINE
)
# A Prometheus text value (Python's float() also takes `1_0` and surrounding spaces: not llama-server's).
_VALUE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?Inf|NaN")


def parse_metrics(body: object) -> tuple[dict[str, int], dict[str, str]]:
    """The figures of `METRICS_FIGURES` in llama-server's own `/metrics` text, and those not understood → why.

    Never raises: a figure that is absent, or not a count llama-server can have written (NaN, negative,
    fractional, past `MAX_DEFERRED`, not a number), is left out on its own, the others kept.

    >>> parse_metrics("# TYPE llamacpp:requests_deferred gauge\\nllamacpp:requests_deferred 3\\n")
    ({'llamacpp:requests_deferred': 3}, {})
    >>> parse_metrics("llamacpp:requests_deferred NaN\\n")
    ({}, {'llamacpp:requests_deferred': "not a count: 'NaN'"})
    """
    found: dict[str, str] = {}
    if isinstance(body, str):
        for m in _SAMPLE.finditer(body):
            found.setdefault(m[1], m[2])  # the first sample of each: llama-server writes one
    figures: dict[str, int] = {}
    rejected: dict[str, str] = {}
    for name in METRICS_FIGURES:
        text = found.get(name)
        if text is None:
            rejected[name] = "absent"
            continue
        value = float(text) if _VALUE.fullmatch(text) else math.nan
        if not (0 <= value <= MAX_DEFERRED) or value != int(value):
            rejected[name] = f"not a count: {text[:40]!r}"
        else:
            figures[name] = int(value)
    return figures, rejected


def _message(body: object) -> str:
    """The `error.message` of a llama-server error body, if any."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
    return ""
