"""What the guard says to llama-server and to clients besides passing a request on: the headers it passes (end to
end, never hop by hop), the errors it answers itself with, and a request's prompt counted with the server's own
tokenizer (`/apply-template`, then `/tokenize`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from exporter.guard.sizing import Plan

#: Headers that describe one connection, not the message (RFC 9110 7.6.1), and those aiohttp sets itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


def end_to_end(headers: Mapping[str, str]) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in headers.items():
        if k.lower() not in HOP_BY_HOP:
            out.add(k, v)
    return out


def sizing_headers(headers: Mapping[str, str], api_key: str | None) -> dict[str, str]:
    """The credentials for the guard's own calls to llama-server: the client's (`Authorization`, else `X-Api-Key`,
    both of which llama-server accepts), else the exporter's `--api-key`."""
    out = {k: headers[k] for k in ("Authorization", "X-Api-Key") if k in headers}
    if not out and api_key:
        out["Authorization"] = f"Bearer {api_key}"
    return out


def error_response(status: int, message: str, error_type: str, retry_after: int | None = None) -> web.Response:
    """An error in llama-server's own JSON shape, with a one-line message."""
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    body = {"error": {"code": status, "message": message, "type": error_type}}
    return web.json_response(body, status=status, headers=headers)


async def read_body(request: web.Request, limit: int, body_timeout: float) -> bytes | web.Response:
    """The request's body, or the error to answer: 413 past the size limit, 408 when it stalls.

    The body may take as long as it needs while it keeps coming; a pause of `body_timeout` between two
    of its bytes ends the connection (a client that sends a head and then holds the connection)."""
    too_large = f"request body larger than the guard's limit of {limit} bytes"
    if request.content_length is not None and request.content_length > limit:
        return error_response(413, too_large, "invalid_request_error")
    content = request.content
    parts: list[bytes] = []
    size = 0
    while True:
        # What has arrived is taken without waiting (a small body is all there with its head).
        chunk = content.read_nowait()
        if not chunk:
            if content.at_eof():
                break
            try:
                chunk = await asyncio.wait_for(content.readany(), body_timeout)
            except (asyncio.TimeoutError, TimeoutError):
                wait = body_timeout
                resp = error_response(408, f"no byte of the request body for {wait:g} s", "invalid_request_error")
                resp.force_close()
                return resp
            if not chunk:
                break
        size += len(chunk)
        if size > limit:
            return error_response(413, too_large, "invalid_request_error")
        parts.append(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def end_stream(response: web.StreamResponse, message: str, anthropic: bool) -> None:
    """End an event stream with an error event in llama-server's own form, then a clean end of the body."""
    error = {"code": 503, "message": message, "type": "unavailable_error"}
    event = "event: error\n" if anthropic else ""
    with contextlib.suppress(ConnectionError, RuntimeError):
        await response.write(f"{event}data: {json.dumps({'error': error})}\n\n".encode())
        await response.write_eof()


def copy_answer(upstream: aiohttp.ClientResponse, body: bytes) -> web.Response:
    """An answer read whole, passed on as it came."""
    response = web.Response(status=upstream.status, reason=upstream.reason, body=body)
    for k, v in upstream.headers.items():
        if k.lower() not in HOP_BY_HOP:
            response.headers.add(k, v)
    return response


def why_unreachable(exc: aiohttp.ClientError) -> str:
    os_error = getattr(exc, "os_error", None)
    return (os_error.strerror or str(os_error)) if os_error is not None else type(exc).__name__


class ServerNotReady(Exception):
    """llama-server answered 503: it is loading its model."""


#: A text longer than this many characters per token of the slot's window is tokenized only this far: a prefix
#: that alone passes the window proves the whole cannot fit (llama-server refuses it before reading it), and
#: one that does not (a text of long tokens) is counted at the window, the most one task holds. So a 5 MB
#: prompt costs the guard the tokenizing of a few window's worth of text, not of 5 MB.
PREFIX_CHARS_PER_TOKEN = 8
#: Tokens a cut text may lose at its cut against the same text uncut (the last word is split differently).
CUT_MARGIN = 64


class NoCountRoute(ValueError):
    """The server has no counting route for this body (an older build answers 404)."""


class Sizer:
    """Counts a request's prompt tokens with llama-server's own tokenizer (its `/apply-template`, `/tokenize`, and
    its counting routes). `window`: one slot's window where known, which bounds the work (see `PREFIX_CHARS_PER_TOKEN`)
    and stands in for what no route can count (a multimodal completion prompt)."""

    def __init__(
        self, session: aiohttp.ClientSession, upstream: str, model: str | None = None, window: int | None = None
    ) -> None:
        self._session = session
        self._upstream = upstream
        self._model = model  # behind a router: the model whose tokenizer counts
        self._window = window

    async def _post(self, path: str, body: Any, headers: Mapping[str, str]) -> Any:
        async with self._session.post(self._upstream + path, json=body, headers=headers) as resp:
            if resp.status == 503 and b"Loading model" in await resp.read():
                raise ServerNotReady(f"{path} answered 503 Loading model")
            if resp.status in (404, 405, 501):
                raise NoCountRoute(f"{path} answered {resp.status}")
            if resp.status != 200:
                raise ValueError(f"{path} answered {resp.status}")
            return await resp.json(content_type=None)

    async def _tokens(self, text: str, headers: Mapping[str, str]) -> int:
        window = self._window
        if window is not None and len(text) > PREFIX_CHARS_PER_TOKEN * window:
            n = await self._tokens(text[: PREFIX_CHARS_PER_TOKEN * window], headers)
            # Past the window even after the cut's margin: too large for any slot, and the count says so.
            # Otherwise the longest prompt a slot takes (llama-server refuses one that fills its window).
            return n if n - CUT_MARGIN > window else window - 1
        # add_special: the BOS the server adds to a prompt counts too (llama-server sizes prompts this way).
        body: dict[str, Any] = {"content": text, "add_special": True}
        if self._model is not None:
            body["model"] = self._model
        out = await self._post("/tokenize", body, headers)
        tokens = out.get("tokens") if isinstance(out, dict) else None
        if not isinstance(tokens, list):
            raise ValueError("/tokenize gave no tokens")
        return len(tokens)

    async def prompt_tokens(self, p: Plan, raw: bytes, headers: Mapping[str, str]) -> int:
        """The prompts' tokens (each prompt once: its `n` copies share its cells); raises ValueError (or an aiohttp
        error) when the server will not say."""
        try:
            return await self._prompt_tokens(p, raw, headers)
        except NoCountRoute:
            # Images or audio on a build without a counting route: the longest prompt a slot takes, per prompt.
            if p.media and self._window is not None:
                return (self._window - 1) * p.prompts
            raise

    async def _prompt_tokens(self, p: Plan, raw: bytes, headers: Mapping[str, str]) -> int:
        if p.windows:
            if self._window is None:
                raise ValueError("a multimodal prompt and no slot window known")
            return (self._window - 1) * p.windows
        if p.template:
            out = await self._post("/apply-template", json.loads(raw), headers)
            prompt = out.get("prompt") if isinstance(out, dict) else None
            if not isinstance(prompt, str):
                raise ValueError("/apply-template gave no prompt")
            return await self._tokens(prompt, headers)
        if p.count_route is not None:
            out = await self._post(p.count_route, json.loads(raw), headers)
            n = out.get("input_tokens") if isinstance(out, dict) else None
            if not isinstance(n, int):
                raise ValueError(f"{p.count_route} gave no input_tokens")
            return n
        total = sum(p.token_counts)  # prompts given as tokens
        for text in p.texts:
            total += await self._tokens(text, headers)
        return total
