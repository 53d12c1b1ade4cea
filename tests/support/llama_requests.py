"""Requests to a server under test, from a test's side: GET or POST JSON, prompts of a given size, four
completions released at the same instant, a free port, and a bounded wait for a condition.

Plain helpers (no pytest dependency) so that tests, benchmarks and ad-hoc scripts can share them;
``llama_harness`` exports them with the process harnesses.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

_T = TypeVar("_T")


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(
    condition: Callable[[], _T | None], timeout: float, *, interval: float = 0.02, what: str = "condition"
) -> _T:
    """Poll ``condition`` until it returns something truthy; return that value.

    Raises ``TimeoutError`` naming ``what`` after ``timeout`` seconds. Tests use this instead of
    fixed sleeps so that they are as fast as the system allows and bounded when it is not.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(interval)


def http_request(url: str, *, body: Mapping[str, Any] | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    """GET (or POST JSON when ``body`` is given); return (status, raw body), non-2xx included."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as e:  # 4xx/5xx still carry the JSON error body we want
        with e:
            return int(e.code), e.read()


def http_json(url: str, *, body: Mapping[str, Any] | None = None, timeout: float = 10.0) -> tuple[int, dict[str, Any]]:
    """Like :func:`http_request` but decodes a JSON object (``{}`` when the body is not one)."""
    status, raw = http_request(url, body=body, timeout=timeout)
    try:
        decoded = json.loads(raw)
    except ValueError:
        return status, {}
    return status, decoded if isinstance(decoded, dict) else {"_": decoded}


def try_http_status(url: str, timeout: float = 1.0) -> int | None:
    """Status of GET ``url``, or None while nothing accepts the connection yet."""
    try:
        return http_request(url, timeout=timeout)[0]
    except (OSError, urllib.error.URLError):
        return None


def make_prompt(chars: int) -> str:
    """English-looking prompt of exactly ``chars`` characters (~1 tiny-model token per character)."""
    base = "The quick brown fox jumps over the lazy dog while the server counts every token. "
    return (base * (chars // len(base) + 1))[:chars]


def run_concurrent_completions(
    url: str,
    n: int = 4,
    *,
    prompt_chars: int = 100,
    n_predict: int = 400,
    ignore_eos: bool = True,
    timeout: float = 30.0,
    extra: Mapping[str, Any] | None = None,
) -> list[tuple[int, dict[str, Any]]]:
    """Send ``n`` POST /completion requests at the same instant; return (status, JSON body) each.

    With ``-c 512 -np 4 -kvu`` and the defaults (4 x ~100-token prompts, 400 tokens each, EOS
    ignored) the four sequences outgrow the shared 512-cell pool together: the server runs the
    "retrying with smaller batch size" cascade and answers all four with HTTP 500 "Context size has
    been exceeded." within ~100 ms. A barrier releases the threads together because a request that
    started ~20 ms early could finish alone before the pool fills.
    """
    body: dict[str, Any] = {
        "prompt": make_prompt(prompt_chars),
        "n_predict": n_predict,
        "ignore_eos": ignore_eos,
        "cache_prompt": False,
        **(extra or {}),
    }
    endpoint = url.rstrip("/") + "/completion"
    results: list[tuple[int, dict[str, Any]] | BaseException | None] = [None] * n
    barrier = threading.Barrier(n)

    def worker(i: int) -> None:
        try:
            barrier.wait(timeout)
            results[i] = http_json(endpoint, body=body, timeout=timeout)
        except BaseException as e:  # re-raised in the caller's thread below
            results[i] = e

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    out: list[tuple[int, dict[str, Any]]] = []
    for r in results:
        if isinstance(r, BaseException):
            raise r
        if r is None:
            raise TimeoutError(f"a /completion request did not finish within {timeout}s")
        out.append(r)
    return out
