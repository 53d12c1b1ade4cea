"""Who sent a request: a bounded client name for the guard's books and access log. Pure.

The name comes from the first of these sources that gives one, in this order (each may be left out with
`--guard.client-from`):

- `header`: a request header the operator names (`--guard.client-header X-Client-Name`), the value as
  sent when it is a safe label value (letters, digits, `._-:@/+`, at most 64 bytes), else not used;
- `api-key`: the name the operator gave the request's API key (`Authorization: Bearer KEY` or
  `X-Api-Key: KEY`) in `--guard.client-keys-file`, which holds the keys' SHA-256 digests (hex), never
  the keys: a key itself is neither stored nor written anywhere;
- `user-agent`: the User-Agent's product, lower-cased (`claude-cli/1.0.61 (external, cli)` →
  `claude-cli`; `OpenAI/Python 1.99.1` → `openai-python`);
- `address`: the client's IP address.

Never from a body. At most `max_clients` distinct names are kept (the first seen); every later one is
`other`, so the series stay bounded whatever the clients send:

    >>> namer = ClientNamer(header="X-Client-Name", max_clients=2)
    >>> namer.name({"X-Client-Name": "orchestrator"}, "10.0.0.7")
    'orchestrator'
    >>> namer.name({"User-Agent": "claude-cli/1.0.61 (external, cli)"}, "10.0.0.8")
    'claude-cli'
    >>> namer.name({"X-Client-Name": 'bad"name'}, "10.0.0.9")
    'other'
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from exporter.model.clients import CLIENT_NAME, CLIENT_SOURCES

#: The sources of a name, in their order of preference.
SOURCES = CLIENT_SOURCES
#: The name of every client past the limit.
OTHER = "other"
#: The name when no source gives one (only when `address` is left out).
UNKNOWN = "unknown"
#: A client name is at most this long, of these characters (safe in a label, a JSON line, a log line).
MAX_NAME_BYTES = 64
_PRODUCT = re.compile(r"[A-Za-z0-9._+-]{1,32}")
# User-Agents whose product alone names a library, not the client: the next word says which.
_QUALIFIED = {"openai": "openai-", "anthropic": "anthropic-"}


class KeysFileError(ValueError):
    """The keys file cannot be used (said in one line, naming the file and the line)."""


def safe_name(value: str) -> str | None:
    """`value` when it is a safe client name, else None."""
    return value if CLIENT_NAME.fullmatch(value) else None


def key_digest(key: str) -> str:
    """The digest `--guard.client-keys-file` holds for an API key: SHA-256 of its UTF-8 bytes, hex."""
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def parse_keys_file(text: str, source: str = "keys file") -> dict[str, str]:
    """`digest name` per line (`#` starts a comment) → {digest: name}; raises KeysFileError."""
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise KeysFileError(f"{source}:{n}: expected 'SHA256-HEX NAME', got {len(parts)} fields")
        digest, name = parts[0].lower(), parts[1]
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise KeysFileError(f"{source}:{n}: not a SHA-256 digest (64 hex digits): the key's digest, never the key")
        if safe_name(name) is None:
            raise KeysFileError(f"{source}:{n}: the name must be 1-64 of letters, digits and ._-:@/+")
        out[digest] = name
    return out


def read_keys_file(path: str) -> dict[str, str]:
    """The keys file at `path`; raises KeysFileError with a one-line reason."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KeysFileError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
    return parse_keys_file(text, path)


def user_agent_product(value: str) -> str | None:
    """The product of a User-Agent, lower-cased; None when it has none a label may carry."""
    words = value.split(None, 2)
    if not words:
        return None
    product, _, version = words[0].partition("/")
    if not _PRODUCT.fullmatch(product):
        return None
    product = product.lower()
    prefix = _QUALIFIED.get(product)
    if prefix is not None:
        # `OpenAI/Python 1.99.1`, `OpenAI/JS 5.0.0`: the library's language follows the slash.
        lang = version.lower()
        if _PRODUCT.fullmatch(lang) and not lang[:1].isdigit():
            return prefix + lang
    return product


def api_key(headers: Mapping[str, str]) -> str | None:
    """The API key a request carries (`Authorization: Bearer KEY` or `X-Api-Key`), if any."""
    auth = headers.get("Authorization")
    if auth is not None:
        scheme, _, token = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = headers.get("X-Api-Key")
    return key.strip() if key and key.strip() else None


class ClientNamer:
    """Names each request's client by the operator's rule, bounded to `max_clients` names plus `other`."""

    def __init__(
        self,
        *,
        header: str | None = None,
        keys: Mapping[str, str] | None = None,
        sources: Iterable[str] = SOURCES,
        max_clients: int = 16,
    ) -> None:
        chosen = set(sources)
        unknown = chosen - set(SOURCES)
        if unknown:
            raise ValueError(f"unknown client name sources: {', '.join(sorted(unknown))}")
        self.header = header if "header" in chosen else None
        self.keys = dict(keys or {}) if "api-key" in chosen else {}
        self.user_agent = "user-agent" in chosen
        self.address = "address" in chosen
        self.max_clients = max_clients
        self.known: dict[str, None] = {}  # the names given out, in order (a set that keeps order)

    def raw_name(self, headers: Mapping[str, str], remote: str | None) -> str:
        """The name the rule gives, before the limit."""
        if self.header is not None:
            value = headers.get(self.header)
            if value is not None and safe_name(value) is not None:
                return value
        if self.keys:
            key = api_key(headers)
            if key is not None:
                name = self.keys.get(key_digest(key))
                if name is not None:
                    return name
        if self.user_agent:
            ua = headers.get("User-Agent")
            product = user_agent_product(ua) if ua else None
            if product is not None:
                return product
        if self.address and remote:
            return safe_name(remote) or UNKNOWN
        return UNKNOWN

    def name(self, headers: Mapping[str, str], remote: str | None) -> str:
        """The request's client: its name by the rule, or `other` once `max_clients` names are taken."""
        name = self.raw_name(headers, remote)
        if name in self.known:
            return name
        if len(self.known) >= self.max_clients:
            return OTHER
        self.known[name] = None
        return name
