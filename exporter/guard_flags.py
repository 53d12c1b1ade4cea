"""The guard's flags for who fills the pool: client names, the access log, and admission on or off.

Added to the guard's group of `--help` by exporter/flags.py; their defaults are the fields' of
`exporter.settings.GuardArea` and `ClientOptions`.
"""

from __future__ import annotations

import argparse
from typing import Any, Protocol

from exporter.model.clients import CLIENT_SOURCES


class _AddsFlags(Protocol):
    def add(self, group: argparse._ArgumentGroup, flag: str, text: str, **kwargs: Any) -> None: ...


def _sources(value: str) -> tuple[str, ...]:
    chosen = [v.strip().lower() for v in value.split(",") if v.strip()]
    bad = [v for v in chosen if v not in CLIENT_SOURCES]
    if bad or not chosen:
        raise argparse.ArgumentTypeError(f"expected a list of {', '.join(CLIENT_SOURCES)}, got {value!r}")
    return tuple(s for s in CLIENT_SOURCES if s in chosen)  # always in the order of preference


def positive_int(value: str) -> int:
    """A flag's whole number above 0 (argparse's `type`)."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {value!r}")
    return n


def _on_off(value: str) -> bool:
    v = value.strip().lower()
    if v not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {value!r}")
    return v == "on"


def _header(value: str) -> str:
    if not value or any(not (c.isalnum() or c in "-_") for c in value):
        raise argparse.ArgumentTypeError(f"expected a header name such as X-Client-Name, got {value!r}")
    return value


def add_client_flags(g: argparse._ArgumentGroup, flags: _AddsFlags) -> None:
    """`--guard.admission`, `--guard.client-*`, `--guard.max-clients`, `--guard.access-log*`."""
    flags.add(
        g,
        "--guard.admission",
        "on: requests that do not fit the pool wait their turn and one may be stopped; off: every request is "
        "sent at once (no queue, no preemption) while the books by client and the access log still run, to "
        "see who fills the pool before letting the guard hold anyone.",
        type=_on_off,
        metavar="on|off",
    )
    flags.add(
        g,
        "--guard.client-from",
        "where a request's client name comes from, tried in this order: header (--guard.client-header), "
        "api-key (--guard.client-keys-file), user-agent (its product: claude-cli, openai-python …), address "
        "(the client's IP). Never from a body.",
        type=_sources,
        metavar="LIST",
    )
    flags.add(
        g,
        "--guard.client-header",
        "a request header that names the client (e.g. X-Client-Name), used as sent when it is 1-64 of letters, "
        "digits and ._-:@/+.",
        type=_header,
        shown="none",
        empty_unset=True,
        metavar="NAME",
    )
    flags.add(
        g,
        "--guard.client-keys-file",
        "names for API keys: one 'SHA256-HEX NAME' per line, the hex SHA-256 of a key (printf %s KEY | "
        "sha256sum), never the key itself; read at start.",
        shown="none",
        empty_unset=True,
        metavar="PATH",
    )
    _add_log_flags(g, flags)


def _add_log_flags(g: argparse._ArgumentGroup, flags: _AddsFlags) -> None:
    flags.add(
        g,
        "--guard.max-clients",
        "client names kept apart at most (the first seen); every later one counts as 'other'.",
        type=positive_int,
        metavar="N",
    )
    flags.add(
        g,
        "--guard.access-log",
        "append one JSON line per generation request to this file (time, id, client, route, prompt tokens, "
        "budget, slot, outcome, status, duration; never a body or a key), written off the request path.",
        shown="none",
        empty_unset=True,
        metavar="PATH",
    )
    flags.add(
        g,
        "--guard.access-log-max-bytes",
        "past this size the access log is moved to PATH.1 (replacing it) and started anew.",
        type=positive_int,
        metavar="BYTES",
    )
