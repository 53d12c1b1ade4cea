"""`--web.config.file`: TLS, basic auth and response headers in Prometheus' exporter-toolkit format.

The same YAML file that node_exporter and every exporter-toolkit program take::

    tls_server_config:
      cert_file: server.crt          # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # mTLS; default NoClientCert
      client_ca_file: ca.crt
      min_version: TLS12             # TLS10 … TLS13, default TLS12
    http_server_config:
      headers:
        Strict-Transport-Security: max-age=31536000
    basic_auth_users:
      prometheus: $2y$10$…           # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\n')

What Python's `ssl` cannot do is refused at start with a one-line error rather than ignored: more
than one entry in `curve_preferences`, and `client_allowed_sans`. `http2` is accepted; the exporter
speaks HTTP/1.1. Unknown keys are errors, as in exporter-toolkit. Parsing is pure
(`parse_web_config`); reading the files it names happens in `load_web_config` and `ssl_context`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import logging
import os
import ssl
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "BasicAuth",
    "TLSConfig",
    "WebConfig",
    "WebConfigError",
    "WebConfigWatcher",
    "load_web_config",
    "ssl_context",
]

logger = logging.getLogger(__name__)


class WebConfigError(ValueError):
    """A web config file that cannot be used; the message is one line."""


# exporter-toolkit's names; Go's TLS versions and client auth types.
_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,  # asked for, not verified in Go; OpenSSL verifies what it gets
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_CURVES = {"CurveP256": "prime256v1", "CurveP384": "secp384r1", "CurveP521": "secp521r1", "X25519": "X25519"}
# Go's TLS 1.2 cipher suite names -> OpenSSL's (TLS 1.3 suites are not configurable, as in Go).
_CIPHERS = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
}
# The headers exporter-toolkit lets a config set (it refuses the others, and so do we).
_HEADERS = frozenset(
    {
        "Strict-Transport-Security",
        "X-Content-Type-Options",
        "X-Frame-Options",
        "X-XSS-Protection",
        "Content-Security-Policy",
    }
)


@dataclass(frozen=True)
class TLSConfig:
    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"
    max_version: str | None = None
    cipher_suites: tuple[str, ...] = ()
    curve_preferences: tuple[str, ...] = ()

    def files(self) -> tuple[Path, ...]:
        """The files this configuration reads: a change to any of them is a change of the configuration."""
        return (self.cert_file, self.key_file, *((self.client_ca_file,) if self.client_ca_file else ()))


@dataclass(frozen=True)
class WebConfig:
    tls: TLSConfig | None = None
    users: dict[str, str] = field(default_factory=dict)  # user -> bcrypt hash
    headers: dict[str, str] = field(default_factory=dict)


def _mapping(value: Any, where: str, keys: frozenset[str] | None) -> dict[str, Any]:
    """`value` as a mapping (None: empty) whose keys are among `keys` (None: any)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{where} must be a mapping")
    unknown = sorted(str(k) for k in value if keys is not None and k not in keys)
    if unknown:
        raise WebConfigError(f"{where}: unknown field {unknown[0]!r}")
    return value


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise WebConfigError(f"{where} must be a list of names")
    return tuple(value)


def parse_web_config(text: str, directory: Path) -> WebConfig:
    """A web config from its YAML text; relative file names are taken relative to `directory`. Pure."""
    import yaml  # only where a web config is used: it costs the exporter ~1.5 MiB of memory

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise WebConfigError(f"not valid YAML{where}") from None
    top = _mapping(doc, "the file", frozenset({"tls_server_config", "http_server_config", "basic_auth_users"}))
    tls_doc = _mapping(
        top.get("tls_server_config"),
        "tls_server_config",
        frozenset(
            {
                "cert_file",
                "key_file",
                "client_auth_type",
                "client_ca_file",
                "min_version",
                "max_version",
                "cipher_suites",
                "curve_preferences",
                "prefer_server_cipher_suites",
                "client_allowed_sans",
            }
        ),
    )
    http_doc = _mapping(top.get("http_server_config"), "http_server_config", frozenset({"http2", "headers"}))
    users_doc = _mapping(top.get("basic_auth_users"), "basic_auth_users", None)
    return WebConfig(tls=_tls(tls_doc, directory), users=_users(users_doc), headers=_headers(http_doc))


def _tls(doc: dict[str, Any], directory: Path) -> TLSConfig | None:
    cert, key = doc.get("cert_file"), doc.get("key_file")
    if not doc or (not cert and not key and not doc.get("client_ca_file")):
        return None  # no TLS: plain HTTP, as exporter-toolkit does for an empty tls_server_config
    if not cert:
        raise WebConfigError("tls_server_config: missing cert_file")
    if not key:
        raise WebConfigError("tls_server_config: missing key_file")
    auth = doc.get("client_auth_type") or "NoClientCert"
    if auth not in _CLIENT_AUTH:
        raise WebConfigError(f"tls_server_config: client_auth_type {auth!r} is not one of {', '.join(_CLIENT_AUTH)}")
    ca = doc.get("client_ca_file")
    if auth in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert") and not ca:
        raise WebConfigError(f"tls_server_config: client_auth_type {auth} needs client_ca_file")
    if ca and auth == "NoClientCert":
        raise WebConfigError("tls_server_config: client_ca_file is set but client_auth_type is NoClientCert")
    versions = {}
    for name in ("min_version", "max_version"):
        value = doc.get(name)
        if value is not None and value not in _VERSIONS:
            raise WebConfigError(f"tls_server_config: {name} {value!r} is not one of {', '.join(_VERSIONS)}")
        versions[name] = value
    ciphers = _strings(doc.get("cipher_suites"), "tls_server_config: cipher_suites")
    for c in ciphers:
        if c not in _CIPHERS:
            raise WebConfigError(f"tls_server_config: cipher suite {c!r} is unknown or not available in Python's ssl")
    curves = _strings(doc.get("curve_preferences"), "tls_server_config: curve_preferences")
    for c in curves:
        if c not in _CURVES:
            raise WebConfigError(f"tls_server_config: curve {c!r} is not one of {', '.join(_CURVES)}")
    if len(curves) > 1:
        raise WebConfigError("tls_server_config: curve_preferences: Python's ssl can restrict TLS to one curve only")
    if doc.get("client_allowed_sans"):
        raise WebConfigError("tls_server_config: client_allowed_sans is not supported by this exporter")
    return TLSConfig(
        cert_file=directory / str(cert),
        key_file=directory / str(key),
        client_auth_type=auth,
        client_ca_file=directory / str(ca) if ca else None,
        min_version=versions["min_version"] or "TLS12",
        max_version=versions["max_version"],
        cipher_suites=ciphers,
        curve_preferences=curves,
    )


def _users(doc: dict[str, Any]) -> dict[str, str]:
    users: dict[str, str] = {}
    for user, hashed in doc.items():
        if not isinstance(user, str) or not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise WebConfigError(f"basic_auth_users: the password of {user!r} must be a bcrypt hash ($2y$…)")
        users[user] = hashed
    return users


def _headers(doc: dict[str, Any]) -> dict[str, str]:
    headers = _mapping(doc.get("headers"), "http_server_config: headers", _HEADERS)
    if not all(isinstance(v, str) for v in headers.values()):
        raise WebConfigError("http_server_config: header values must be strings")
    return dict(headers)


def load_web_config(path: str | os.PathLike[str]) -> WebConfig:
    """Read and check a web config file and what it names (an SSL context is built once to check it)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise WebConfigError(f"cannot read {p}: {exc.strerror or exc}") from None
    try:
        config = parse_web_config(text, p.parent)
    except WebConfigError as exc:
        raise WebConfigError(f"{p}: {exc}") from None
    if config.tls is not None:
        ssl_context(config.tls)
    return config


def ssl_context(tls: TLSConfig, into: ssl.SSLContext | None = None) -> ssl.SSLContext:
    """A server SSL context for `tls` (or `into`, changed in place: new connections use the new settings)."""
    ctx = into if into is not None else ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    except FileNotFoundError as exc:
        raise WebConfigError(f"tls_server_config: {exc.filename}: no such file") from None
    except (ssl.SSLError, OSError) as exc:
        raise WebConfigError(f"tls_server_config: cert_file/key_file: {_ssl_reason(exc)}") from None
    ctx.minimum_version = _VERSIONS[tls.min_version]
    ctx.maximum_version = _VERSIONS[tls.max_version] if tls.max_version else ssl.TLSVersion.MAXIMUM_SUPPORTED
    ctx.verify_mode = _CLIENT_AUTH[tls.client_auth_type]
    if tls.client_ca_file is not None:
        try:
            ctx.load_verify_locations(cafile=tls.client_ca_file)
        except FileNotFoundError:
            raise WebConfigError(f"tls_server_config: {tls.client_ca_file}: no such file") from None
        except (ssl.SSLError, OSError) as exc:
            raise WebConfigError(f"tls_server_config: client_ca_file: {_ssl_reason(exc)}") from None
    if tls.cipher_suites:
        try:
            ctx.set_ciphers(":".join(_CIPHERS[c] for c in tls.cipher_suites))
        except ssl.SSLError:
            raise WebConfigError("tls_server_config: none of cipher_suites is available here") from None
    if tls.curve_preferences:
        ctx.set_ecdh_curve(_CURVES[tls.curve_preferences[0]])
    return ctx


def _ssl_reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)
    return str(reason).replace("\n", " ")[:200]


def basic_credentials(header: str) -> tuple[str, str] | None:
    """(user, password) of an `Authorization: Basic …` header, or None."""
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


_DUMMY_HASH = b"$2b$10$" + b"." * 53  # verified against when the user is unknown: the same cost either way


class BasicAuth:
    """Checks `Authorization: Basic` headers against bcrypt hashes, with a cache of results.

    bcrypt is slow on purpose (tens of milliseconds at cost 10); a scraper sends the same credentials
    every few seconds, so a result is cached under a SHA-256 of user, password and hash, never under the
    password itself. A wrong password costs the full bcrypt once, and an unknown user the same as a
    known one.
    """

    def __init__(self, users: dict[str, str], cache_size: int = 256) -> None:
        self.users = dict(users)
        self._cache: OrderedDict[bytes, bool] = OrderedDict()
        self._cache_size = cache_size

    def cached(self, user: str, password: str) -> bool | None:
        """The cached result for these credentials, or None when bcrypt must decide."""
        return self._cache.get(self._key(user, password))

    def verify(self, user: str, password: str) -> bool:
        """bcrypt's answer (slow: run it off the event loop), remembered for `cached`."""
        import bcrypt  # only where basic auth is configured

        hashed = self.users.get(user)
        try:
            ok = bcrypt.checkpw(password.encode(), hashed.encode() if hashed else _DUMMY_HASH) and hashed is not None
        except ValueError:  # a malformed hash in the file
            ok = False
        key = self._key(user, password)
        self._cache[key] = ok
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return ok

    def _key(self, user: str, password: str) -> bytes:
        return hashlib.sha256(f"{user}\0{password}\0{self.users.get(user, '')}".encode()).digest()


class WebConfigWatcher:
    """The web config in use, re-read when its file or a file it names changes (as exporter-toolkit does).

    A change that cannot be used (a broken file, a missing certificate) is logged once and the last good
    configuration stays. TLS is turned on or off only at start: the listening socket is made for one.
    """

    def __init__(self, path: str | os.PathLike[str], *, interval: float = 2.0) -> None:
        self.path = Path(path)
        self.interval = interval
        self.config = load_web_config(self.path)  # WebConfigError at start: the caller says it and exits
        self.ssl_context = ssl_context(self.config.tls) if self.config.tls is not None else None
        self._auth = BasicAuth(self.config.users)
        self._bcrypt_slots = asyncio.Semaphore(2)  # a flood of wrong passwords must not take every thread
        self._stamp = self._fingerprint()
        self._reported: str | None = None

    def _fingerprint(self) -> tuple[tuple[int, int, int] | None, ...]:
        files = [self.path, *(self.config.tls.files() if self.config.tls is not None else ())]
        out: list[tuple[int, int, int] | None] = []
        for f in files:
            try:
                st = f.stat()
                out.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                out.append(None)
        return tuple(out)

    def check(self) -> bool:
        """Re-read the files if they changed; True when a new configuration is in use."""
        stamp = self._fingerprint()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            config = load_web_config(self.path)
            if (config.tls is None) != (self.config.tls is None):
                raise WebConfigError("TLS can only be turned on or off by restarting the exporter")
            if config.tls is not None and self.ssl_context is not None:
                ssl_context(config.tls, into=self.ssl_context)
        except WebConfigError as exc:
            message = str(exc)
            if message != self._reported:
                logger.warning("web config not reloaded, the previous one stays in use: %s", message)
                self._reported = message
            return False
        self.config, self._auth, self._reported = config, BasicAuth(config.users), None
        self._stamp = self._fingerprint()
        logger.info("web config %s reloaded", self.path)
        return True

    async def watch(self, stop: asyncio.Event) -> None:
        """Check for changes every `interval` seconds until `stop` is set."""
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
            if not stop.is_set():
                self.check()

    async def check_basic_auth(self, header: str) -> bool:
        """Whether an `Authorization` header carries a user and password of the config."""
        credentials = basic_credentials(header)
        if credentials is None:
            return False
        auth = self._auth
        cached = auth.cached(*credentials)
        if cached is not None:
            return cached
        async with self._bcrypt_slots:
            return await asyncio.get_running_loop().run_in_executor(None, auth.verify, *credentials)
