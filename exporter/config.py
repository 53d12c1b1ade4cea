"""Command-line flags, each also settable by an environment variable (`LLAMACPP_EXPORTER_<FLAG>`).

Flags win over the environment. A bad value ends the program with one line naming the flag.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn
from urllib.parse import urlsplit

from exporter import __version__

DEFAULT_PORT = 9778  # not 8080/9090/9093/9100/3000; the 9100-9999 exporter range has no free registration left
ENV_PREFIX = "LLAMACPP_EXPORTER_"


@dataclass(frozen=True)
class Config:
    """Validated settings."""

    log_file: str | None
    listen_host: str
    listen_port: int
    server_url: str
    log_poll_interval: float
    fs_events: bool
    demo: bool
    demo_speed: float
    log_level: str


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; an operator reading a journal wants one line."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _listen_address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. 0.0.0.0:{DEFAULT_PORT}), got {value!r}")
    return host.strip("[]"), int(port)


def _url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"expected an http(s) URL like http://127.0.0.1:8080, got {value!r}")
    return value.rstrip("/")


def _positive_float(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not f > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {value!r}")
    return f


def _bool(value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """The parser; defaults come from `env` so `--help` shows what is in effect."""

    def default(flag: str, fallback: str) -> str:
        return env.get(ENV_PREFIX + flag.upper().replace("-", "_"), fallback)

    def env_name(flag: str) -> str:
        return ENV_PREFIX + flag.upper().replace("-", "_")

    p = _OneLineParser(
        prog="llamacpp-exporter",
        description="Prometheus exporter and alerting sidecar for llama.cpp's llama-server: per-slot tokens, "
        "shared KV pool fill and overcommit, retry cascades and aborted requests, from the server's log.",
        epilog="Every flag can also be set through the environment variable shown in brackets. "
        "Run llama-server with --log-file PATH and -lv 4 for the full picture (at the default -lv 3 the "
        "KV pool size and per-request prompt lines are hidden and estimated).",
    )
    p.add_argument(
        "--log-file",
        default=env.get(env_name("log-file")),
        metavar="PATH",
        help="llama-server's --log-file to follow, or - for standard input. Waited for if it does not "
        f"exist yet. [{env_name('log-file')}]",
    )
    p.add_argument(
        "--listen-address",
        type=_listen_address,
        default=default("listen-address", f"0.0.0.0:{DEFAULT_PORT}"),
        metavar="HOST:PORT",
        help=f"where to serve /metrics (default 0.0.0.0:{DEFAULT_PORT}). [{env_name('listen-address')}]",
    )
    p.add_argument(
        "--server-url",
        type=_url,
        default=default("server-url", "http://127.0.0.1:8080"),
        metavar="URL",
        help="llama-server's HTTP address; shown on the landing page and used by the live HTTP source "
        f"(/health, /slots) (default http://127.0.0.1:8080). [{env_name('server-url')}]",
    )
    p.add_argument(
        "--log-poll-interval",
        type=_positive_float,
        default=default("log-poll-interval", "1.0"),
        metavar="SECONDS",
        help="how often to stat() the log even without filesystem events (default 1.0). "
        f"[{env_name('log-poll-interval')}]",
    )
    p.add_argument(
        "--fs-events",
        type=_bool,
        default=default("fs-events", "true"),
        metavar="BOOL",
        help="also wake on filesystem events (watchdog/inotify); false = polling only, for NFS and similar "
        f"(default true). [{env_name('fs-events')}]",
    )
    p.add_argument(
        "--demo",
        action="store_true",
        default=default("demo", "false"),
        help="no llama-server needed: replay a recorded real llama-server log (shipped with the package) "
        f"in a loop at its recorded pace and export it. [{env_name('demo')}]",
    )
    p.add_argument(
        "--demo-speed",
        type=_positive_float,
        default=default("demo-speed", "1.0"),
        metavar="FACTOR",
        help=f"replay speed for --demo (default 1.0 = recorded pace). [{env_name('demo-speed')}]",
    )
    p.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=default("log-level", "info").lower(),
        help=f"the exporter's own log level (default info). [{env_name('log-level')}]",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return p


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Parse flags (and the environment) into a `Config`; exits with a one-line error when invalid."""
    environ = os.environ if env is None else env
    parser = build_parser(environ)
    try:
        ns = parser.parse_args(argv)
    except argparse.ArgumentTypeError as exc:  # an invalid environment default
        parser.error(str(exc))
    # argparse converts string defaults with `type`, so environment values are validated too.
    if ns.log_file is not None and not ns.log_file.strip():
        parser.error("--log-file: empty path")
    try:
        demo = ns.demo if isinstance(ns.demo, bool) else _bool(ns.demo)
    except argparse.ArgumentTypeError as exc:
        parser.error(f"{ENV_PREFIX}DEMO: {exc}")
    if not demo and not ns.log_file:
        parser.error("--log-file is required (or --demo to replay a recorded log)")
    host, port = ns.listen_address
    return Config(
        log_file=ns.log_file,
        listen_host=host,
        listen_port=port,
        server_url=ns.server_url,
        log_poll_interval=ns.log_poll_interval,
        fs_events=ns.fs_events,
        demo=demo,
        demo_speed=ns.demo_speed,
        log_level=ns.log_level,
    )
