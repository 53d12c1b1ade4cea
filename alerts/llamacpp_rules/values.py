"""What a setting's value must be: a Prometheus duration, a link a pager can open."""

from __future__ import annotations

import re
from urllib.parse import urlsplit


def seconds(duration: str) -> int:
    """A Prometheus duration ('7d', '1h30m') in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"{duration!r} is not a Prometheus duration")
    return int(sum(int(n) * units[u] for n, u in parts))


#: Hosts that are placeholders or this machine only: a link to them is dead on a pager.
PLACEHOLDER_HOSTS = re.compile(r"(^|\.)(example\.(com|org|net)|localhost|invalid|test)$|^127\.|^\[?::1\]?$")


def absolute_url(name: str, url: str) -> str:
    """``url`` without a trailing slash, if it is an absolute http(s) URL that is not a placeholder; '' stays
    '' (no link); else a one-line ValueError."""
    if url == "":
        return ""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{name} must be an absolute http(s) URL that a pager can open (https://...), not {url!r}")
    if PLACEHOLDER_HOSTS.search(parts.hostname or ""):
        raise ValueError(
            f"{name} {url!r} is a placeholder or this machine only: a pager cannot open it; give the real address"
        )
    return url.rstrip("/")
