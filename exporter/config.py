"""Settings: the command line and the environment (exporter/flags.py) checked together into a `Config`.

Flags win over the environment. A bad value ends the program with one line naming the flag, or the
environment variable it came from.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from exporter.flags import (
    ENV_PREFIX,
    LOG_LEVELS,
    LOG_SOURCES,
    PROCESS_SOURCES,
    bool_value,
    build_parser,
    read_api_key_file,
    url_value,
)
from exporter.servers_file import ServersFileError, ServerSpec, read_servers_file
from exporter.settings import (
    DEFAULT_PORT,
    DEFAULT_PROC_ROOT,
    ClientOptions,
    GuardArea,
    HostArea,
    HttpArea,
    LogArea,
    OutputArea,
    WebArea,
    area_of,
)

__all__ = ["DEFAULT_PORT", "ENV_PREFIX", "Config", "parse_config"]


@dataclass(frozen=True)
class Config:
    """Validated settings, one area per group of `--help` (exporter/settings.py holds each field's default)."""

    logs: LogArea = field(default_factory=LogArea)
    http: HttpArea = field(default_factory=HttpArea)
    host: HostArea = field(default_factory=HostArea)
    web: WebArea = field(default_factory=WebArea)
    guard: GuardArea = field(default_factory=GuardArea)
    clients: ClientOptions = field(default_factory=ClientOptions)  # the guard's client names and access log
    output: OutputArea = field(default_factory=OutputArea)
    # --servers-file: several servers, each with its own log, URL and pid (empty: the flags' one server).
    servers: tuple[ServerSpec, ...] = ()


def _process_source(parser: argparse.ArgumentParser, source: str) -> str:
    """--process-source, whose value may come from the environment (argparse checks only the flag's)."""
    if source not in PROCESS_SOURCES:
        parser.error(f"argument --process-source: invalid choice {source!r} (choose from {', '.join(PROCESS_SOURCES)})")
    return source


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
        if not sys.platform.startswith("linux"):
            parser.error("--journal-unit: the systemd journal exists only on Linux; follow the log file (--log-file)")
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


def _servers(
    parser: argparse.ArgumentParser,
    ns: argparse.Namespace,
    argv: Sequence[str] | None,
    environ: Mapping[str, str],
    demo: bool,
) -> tuple[ServerSpec, ...]:
    """`--servers-file`, read; the flags it replaces must be left out."""
    given = [f for f in ("log_file", "journal_unit", "pid", "pid_file") if getattr(ns, f) is not None]
    # --server-url has a default: given only when on the command line or in the environment.
    args = list(argv) if argv is not None else sys.argv[1:]
    if any(a == "--server-url" or a.startswith("--server-url=") for a in args) or ENV_PREFIX + "SERVER_URL" in environ:
        given.append("server_url")
    if given or demo or (ns.log_source not in (None, "file")):
        what = f"--{given[0].replace('_', '-')}" if given else "--demo" if demo else "--log-source"
        parser.error(f"--servers-file names each server's log, URL and pid: leave out {what}")
    try:
        return read_servers_file(ns.servers_file, url_value)
    except ServersFileError as exc:
        parser.error(f"--servers-file {ns.servers_file}: {exc}")


def _check_together(
    parser: argparse.ArgumentParser, ns: argparse.Namespace, servers: tuple[ServerSpec, ...], demo: bool
) -> None:
    """The checks argparse cannot make: choices of environment defaults, flags that exclude each other."""
    if ns.log_level not in LOG_LEVELS:  # argparse checks the choices of a flag, not of an environment default
        parser.error(f"argument --log-level: invalid choice {ns.log_level!r} (choose from {', '.join(LOG_LEVELS)})")
    if ns.pid is not None and ns.pid_file is not None:
        parser.error("--pid and --pid-file: give one of them")
    if ns.pid_file is not None and not ns.pid_file.strip():
        parser.error("--pid-file: empty path")
    # The default /proc is not checked: where there is none (Windows, macOS) the /proc source is simply not
    # used. A root given on purpose must be a directory while --proc is on.
    if ns.proc and ns.proc_root != DEFAULT_PROC_ROOT and not Path(ns.proc_root).is_dir():
        parser.error(f"argument --proc-root: not a directory: {ns.proc_root!r}")
    if ns.guard_listen_address and (servers or demo):
        parser.error(
            "--guard.listen-address guards one llama-server (--server-url): leave out "
            + ("--servers-file" if servers else "--demo")
        )


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Parse flags (and the environment) into a `Config`; exits with a one-line error when invalid."""
    environ = os.environ if env is None else env
    parser = build_parser(environ)
    parser.given = list(sys.argv[1:] if argv is None else argv)  # type: ignore[attr-defined]
    try:
        ns = parser.parse_args(argv)
    except argparse.ArgumentTypeError as exc:  # an invalid environment default
        parser.error(str(exc))
    # argparse converts string defaults with `type`, so environment values are validated too.
    if ns.log_file is not None and not ns.log_file.strip():
        parser.error("--log-file: empty path")
    try:
        demo = ns.demo if isinstance(ns.demo, bool) else bool_value(ns.demo)
    except argparse.ArgumentTypeError as exc:
        parser.error(f"{ENV_PREFIX}DEMO: {exc}")
    if ns.servers_file is not None:
        servers = _servers(parser, ns, argv, environ, demo)
        log_source = "file"
    else:
        servers = ()
        log_source = _log_source(parser, ns, demo)
    _check_together(parser, ns, servers, demo)
    return Config(
        logs=area_of(LogArea, ns, source=log_source, demo=demo),
        http=area_of(HttpArea, ns, api_key=_api_key(parser, ns, environ)),
        host=area_of(HostArea, ns, process_source=_process_source(parser, ns.process_source)),
        web=area_of(WebArea, ns),
        guard=area_of(GuardArea, ns),
        clients=area_of(ClientOptions, ns),
        output=area_of(OutputArea, ns),
        servers=servers,
    )
