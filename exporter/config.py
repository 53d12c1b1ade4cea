"""Command-line flags, each also settable by an environment variable (`LLAMACPP_EXPORTER_<FLAG>`).

Flags win over the environment. A bad value ends the program with one line naming the flag.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

from exporter import __version__
from exporter.servers_file import ServersFileError, ServerSpec, read_servers_file

LOG_SOURCES = ("file", "stdin", "journald")
LOG_LEVELS = ("debug", "info", "warning", "error")
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
    log_batch_interval: float
    fs_events: bool
    demo: bool
    demo_speed: float
    log_level: str
    # Where log lines come from: "file" (--log-file PATH), "stdin" (--log-file -), "journald" (--journal-unit).
    log_source: str = "file"
    journal_unit: str | None = None
    journal_namespace: str | None = None
    journal_directory: str | None = None
    # Live sources (exporter/sources): NVML, /proc, llama-server's HTTP endpoints.
    nvml: bool = True
    proc: bool = True
    http: bool = True
    pid: int | None = None
    pid_file: str | None = None
    proc_root: str = "/proc"
    server_timeout: float = 2.0
    api_key: str | None = field(default=None, repr=False)  # never printed
    kv_pool_capacity: int | None = None
    web_config_file: str | None = None
    # --servers-file: several servers, each with its own log, URL and pid (empty: the flags' one server).
    servers: tuple[ServerSpec, ...] = ()


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; an operator reading a journal wants one line."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _listen_address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. 0.0.0.0:{DEFAULT_PORT}), got {value!r}")
    if not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"port {int(port)} is out of range (0 to 65535) in {value!r}")
    return host.strip("[]"), int(port)


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


def _url(value: str) -> str:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  (ValueError for a port that is not a number from 0 to 65535)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"expected an http(s) URL like http://127.0.0.1:8080, got {value!r}")
    return value.rstrip("/")


def _url_value(value: str) -> str:
    """`_url` for the servers file: a ValueError rather than argparse's error."""
    try:
        return _url(value)
    except argparse.ArgumentTypeError as exc:
        raise ValueError(str(exc)) from None


def _positive_float(value: str) -> float:
    try:
        f = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not f > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {value!r}")
    return f


def _interval(most: float) -> Callable[[str], float]:
    """A positive number of seconds, at most `most`: a longer wait only leaves the metrics that far behind."""

    def parse(value: str) -> float:
        f = _positive_float(value)
        if f > most:
            raise argparse.ArgumentTypeError(f"must be at most {most:g} seconds, got {value!r}")
        return f

    return parse


def _timeout(value: str) -> float:
    f = _positive_float(value)
    if f > 30:
        raise argparse.ArgumentTypeError(
            f"must be at most 30 seconds (a scrape must finish within Prometheus' scrape timeout), got {value!r}"
        )
    return f


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {value!r}")
    return n


def _directory(value: str) -> str:
    if not Path(value).is_dir():
        raise argparse.ArgumentTypeError(f"not a directory: {value!r}")
    return value


def read_api_key_file(path: str) -> str:
    """The first key in an API key file (llama-server's format: one key per line, `#` starts a comment)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    for line in text.splitlines():
        key = line.strip()
        if key and not key.startswith("#"):
            return key
    raise argparse.ArgumentTypeError(f"no key in {path!r} (one key per line; lines starting with # are comments)")


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
        epilog="Post-mortem of a log (what failed, when, and what to change): llamacpp-exporter diagnose LOG "
        "(see llamacpp-exporter diagnose --help). "
        "Every flag can also be set through the environment variable shown in brackets. "
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
        "--log-source",
        choices=LOG_SOURCES,
        default=env.get(env_name("log-source")) or None,
        help="where the log lines come from: file (--log-file PATH, the default), stdin (same as --log-file -), "
        "or journald (the systemd journal of --journal-unit). "
        f"[{env_name('log-source')}]",
    )
    p.add_argument(
        "--journal-unit",
        default=env.get(env_name("journal-unit")),
        metavar="UNIT",
        help="with --log-source journald: the unit whose journal to follow, e.g. llama-server.service "
        "(implies --log-source journald). Needs read access to the journal (group systemd-journal). "
        f"[{env_name('journal-unit')}]",
    )
    p.add_argument(
        "--journal-namespace",
        default=env.get(env_name("journal-namespace")),
        metavar="NAME",
        help="with --log-source journald: the journal namespace of a unit with LogNamespace=NAME. "
        f"[{env_name('journal-namespace')}]",
    )
    p.add_argument(
        "--journal-directory",
        default=env.get(env_name("journal-directory")),
        metavar="DIR",
        help="with --log-source journald: read the journal files in DIR (e.g. the host's /var/log/journal "
        f"mounted into a container) instead of the local journal. [{env_name('journal-directory')}]",
    )
    p.add_argument(
        "--listen-address",
        type=_listen_address,
        default=default("listen-address", f"0.0.0.0:{DEFAULT_PORT}"),
        metavar="HOST:PORT",
        help=f"where to serve /metrics (default 0.0.0.0:{DEFAULT_PORT}; 127.0.0.1:{DEFAULT_PORT} where only a "
        f"local Prometheus scrapes). [{env_name('listen-address')}]",
    )
    p.add_argument(
        "--web.config.file",
        dest="web_config_file",
        default=env.get(ENV_PREFIX + "WEB_CONFIG_FILE") or None,
        metavar="PATH",
        help="TLS, basic auth and response headers, in the YAML format of Prometheus' exporter-toolkit "
        "(the --web.config.file of node_exporter); re-read when it changes. Without it: plain HTTP, no "
        f"auth. [{ENV_PREFIX}WEB_CONFIG_FILE]",
    )
    p.add_argument(
        "--server-url",
        type=_url,
        default=default("server-url", "http://127.0.0.1:8080"),
        metavar="URL",
        help="llama-server's HTTP address; shown on the landing page and used by the live HTTP source "
        f"(/health, /slots, /props) (default http://127.0.0.1:8080). [{env_name('server-url')}]",
    )
    p.add_argument(
        "--log-poll-interval",
        type=_interval(3600),
        default=default("log-poll-interval", "1.0"),
        metavar="SECONDS",
        help="how often to stat() the log even without filesystem events (default 1.0). "
        f"[{env_name('log-poll-interval')}]",
    )
    p.add_argument(
        "--log-batch-interval",
        type=_interval(10),
        default=default("log-batch-interval", "2.0"),
        metavar="SECONDS",
        help="the longest wait between reads while the log keeps growing: the wait starts at 0.025 and doubles "
        "up to this (default 2.0). Longer = fewer wake-ups and less CPU. A line after a quiet spell is read at "
        f"once, and a scrape reads what the log holds first. [{env_name('log-batch-interval')}]",
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
        choices=LOG_LEVELS,
        default=default("log-level", "info").lower(),
        help=f"the exporter's own log level (default info). [{env_name('log-level')}]",
    )
    p.add_argument(
        "--servers-file",
        default=env.get(env_name("servers-file")),
        metavar="FILE",
        help="follow several llama-servers, each named with its log, URL and pid in a YAML file "
        "(servers: a list of name, log_file, url, pid or pid_file); their series get a server label. Replaces "
        f"--log-file, --server-url, --pid and --pid-file. [{env_name('servers-file')}]",
    )
    _add_live_source_flags(p, default, env_name, env)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return p


def _log_source(parser: argparse.ArgumentParser, ns: argparse.Namespace, demo: bool) -> str:
    """Work out (and check) --log-source from --log-file and --journal-unit."""
    source: str | None = ns.log_source
    if source is not None and source not in LOG_SOURCES:  # from the environment (argparse checks flags)
        parser.error(f"argument --log-source: invalid choice {source!r} (choose from {', '.join(LOG_SOURCES)})")
    for flag in ("journal_unit", "journal_namespace", "journal_directory"):
        value = getattr(ns, flag)
        if value is not None and not value.strip():
            parser.error(f"--{flag.replace('_', '-')}: empty value")
    if source is None:
        source = "journald" if ns.journal_unit else "stdin" if ns.log_file == "-" else "file"
    if demo:
        return "file"
    if source == "journald":
        if not ns.journal_unit:
            parser.error("--log-source journald needs --journal-unit UNIT (e.g. llama-server.service)")
        if ns.log_file:
            parser.error("--log-file and --log-source journald exclude each other: choose one source")
    elif ns.journal_unit:
        parser.error(f"--journal-unit needs --log-source journald (not {source})")
    elif source == "stdin":
        if ns.log_file not in (None, "-"):
            parser.error("--log-source stdin reads standard input: leave out --log-file (or use --log-file -)")
    elif not ns.log_file:
        parser.error("--log-file is required (or --log-source journald --journal-unit UNIT, or --demo)")
    elif ns.log_file == "-":
        parser.error("--log-file - is standard input: use --log-source stdin (or leave out --log-source)")
    return source


def _add_live_source_flags(
    p: argparse.ArgumentParser,
    default: Callable[[str, str], str],
    env_name: Callable[[str], str],
    env: Mapping[str, str],
) -> None:
    """Flags of the live sources (NVML, /proc, llama-server's HTTP endpoints)."""
    live = p.add_argument_group(
        "live sources",
        "read at scrape time next to the log; a source that fails reports llamacpp_exporter_source_up{source} 0 "
        "and never fails the scrape",
    )
    live.add_argument(
        "--nvml",
        type=_bool,
        default=default("nvml", "on"),
        metavar="on|off",
        help="GPU memory per GPU and llama-server's own VRAM from NVML (nvidia-ml-py); without a GPU or driver "
        f"the source reports down (default on). [{env_name('nvml')}]",
    )
    live.add_argument(
        "--proc",
        type=_bool,
        default=default("proc", "on"),
        metavar="on|off",
        help="llama-server's RSS, start time and command line, and the host's MemAvailable, from /proc "
        f"(default on). [{env_name('proc')}]",
    )
    live.add_argument(
        "--proc-root",
        type=_directory,
        default=default("proc-root", "/proc"),
        metavar="PATH",
        help=f"where /proc is mounted, e.g. /host/proc in a container (default /proc). [{env_name('proc-root')}]",
    )
    live.add_argument(
        "--pid",
        type=_positive_int,
        default=env.get(env_name("pid")),
        metavar="PID",
        help="llama-server's pid (default: found automatically: the llama-server process that writes or names "
        "--log-file or writes into standard input, else the only llama-server not known to write another log). "
        f"[{env_name('pid')}]",
    )
    live.add_argument(
        "--pid-file",
        default=env.get(env_name("pid-file")),
        metavar="PATH",
        help=f"file holding llama-server's pid, read at every scrape. [{env_name('pid-file')}]",
    )
    live.add_argument(
        "--http",
        type=_bool,
        default=default("http", "on"),
        metavar="on|off",
        help=f"read llama-server's /health, /slots and /props at --server-url (default on). [{env_name('http')}]",
    )
    live.add_argument(
        "--server-timeout",
        type=_timeout,
        default=default("server-timeout", "2.0"),
        metavar="SECONDS",
        help="time limit for each scrape's live reads (HTTP, /proc, NVML), at most 30 (default 2.0). "
        f"[{env_name('server-timeout')}]",
    )
    live.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="llama-server's API key, sent as a Bearer token (/slots and /props need it when the server has "
        "one). Prefer --api-key-file or the environment: a flag shows in ps. "
        f"[{env_name('api-key')}, else LLAMA_API_KEY]",
    )
    live.add_argument(
        "--api-key-file",
        default=None,
        metavar="PATH",
        help="file with the API key: its first line that is neither empty nor a # comment, like llama-server's "
        f"--api-key-file. [{env_name('api-key-file')}]",
    )
    live.add_argument(
        "--kv-pool-capacity",
        type=_positive_int,
        default=env.get(env_name("kv-pool-capacity")),
        metavar="TOKENS",
        help="KV pool size to assume when neither the log nor llama-server's command line gives it "
        f"(capacity_source=flag). [{env_name('kv-pool-capacity')}]",
    )


def _api_key(parser: argparse.ArgumentParser, ns: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    """The key from --api-key, --api-key-file, their environment variables, then llama-server's LLAMA_API_KEY."""
    if ns.api_key is not None and ns.api_key_file is not None:
        parser.error("--api-key and --api-key-file: give one of them")
    candidates: list[tuple[str, str | None, bool]] = [  # (where, value, is a file)
        ("--api-key", ns.api_key, False),
        ("--api-key-file", ns.api_key_file, True),
        (ENV_PREFIX + "API_KEY", env.get(ENV_PREFIX + "API_KEY"), False),
        (ENV_PREFIX + "API_KEY_FILE", env.get(ENV_PREFIX + "API_KEY_FILE"), True),
        # llama-server's own variable: a comma-separated list of keys; any one of them works.
        ("LLAMA_API_KEY", (env.get("LLAMA_API_KEY") or "").split(",")[0], False),
    ]
    for where, value, is_file in candidates:
        if not value:
            continue
        if is_file:
            try:
                return read_api_key_file(value)
            except argparse.ArgumentTypeError as exc:
                parser.error(f"{where}: {exc}")
        key = value.strip()
        if key:
            return key
        parser.error(f"{where}: empty key")
    return None


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
    servers: tuple[ServerSpec, ...] = ()
    if ns.servers_file is not None:
        given = [f for f in ("log_file", "journal_unit", "pid", "pid_file") if getattr(ns, f) is not None]
        # --server-url has a default: given only when on the command line or in the environment.
        args = list(argv) if argv is not None else sys.argv[1:]
        if (
            any(a == "--server-url" or a.startswith("--server-url=") for a in args)
            or ENV_PREFIX + "SERVER_URL" in environ
        ):
            given.append("server_url")
        if given or demo or (ns.log_source not in (None, "file")):
            what = f"--{given[0].replace('_', '-')}" if given else "--demo" if demo else "--log-source"
            parser.error(f"--servers-file names each server's log, URL and pid: leave out {what}")
        try:
            servers = read_servers_file(ns.servers_file, _url_value)
        except ServersFileError as exc:
            parser.error(f"--servers-file {ns.servers_file}: {exc}")
        log_source = "file"
    else:
        log_source = _log_source(parser, ns, demo)
    if ns.log_level not in LOG_LEVELS:  # argparse checks the choices of a flag, not of an environment default
        parser.error(f"argument --log-level: invalid choice {ns.log_level!r} (choose from {', '.join(LOG_LEVELS)})")
    if ns.pid is not None and ns.pid_file is not None:
        parser.error("--pid and --pid-file: give one of them")
    if ns.pid_file is not None and not ns.pid_file.strip():
        parser.error("--pid-file: empty path")
    api_key = _api_key(parser, ns, environ)
    host, port = ns.listen_address
    return Config(
        log_file=ns.log_file,
        listen_host=host,
        listen_port=port,
        server_url=ns.server_url,
        log_poll_interval=ns.log_poll_interval,
        log_batch_interval=ns.log_batch_interval,
        fs_events=ns.fs_events,
        demo=demo,
        demo_speed=ns.demo_speed,
        log_level=ns.log_level,
        log_source=log_source,
        journal_unit=ns.journal_unit,
        journal_namespace=ns.journal_namespace,
        journal_directory=ns.journal_directory,
        nvml=ns.nvml,
        proc=ns.proc,
        http=ns.http,
        pid=ns.pid,
        pid_file=ns.pid_file,
        proc_root=ns.proc_root,
        server_timeout=ns.server_timeout,
        api_key=api_key,
        kv_pool_capacity=ns.kv_pool_capacity,
        web_config_file=ns.web_config_file,
        servers=servers,
    )
