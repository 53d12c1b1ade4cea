"""The command line: flags in groups that follow the data, their value checks, and `--help`.

Each flag can also be set by an environment variable (`LLAMACPP_EXPORTER_<FLAG>`), and `--help`
shows the defaults in effect, environment included. A flag's built-in default is its field's in
exporter/settings.py, the only place it is written; exporter/config.py turns the result into a Config.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

from exporter import __version__
from exporter.guard_flags import add_client_flags, positive_int
from exporter.settings import DEFAULT_PORT, dest, flag_defaults

LOG_SOURCES = ("file", "stdin", "journald")
LOG_LEVELS = ("debug", "info", "warning", "error")
PROCESS_SOURCES = ("auto", "procfs", "psutil")  # --process-source (exporter/sources/process.py)
ENV_PREFIX = "LLAMACPP_EXPORTER_"


class _OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; an operator reading a journal wants one line, naming where the
    value came from: the environment variable when the flag was not on the command line."""

    env: Mapping[str, str] = {}
    given: Sequence[str] = ()  # the command line parsed

    def error(self, message: str) -> NoReturn:
        m = re.match(r"(?:argument )?(--[\w.-]+)(?:/[^:]*)?: (.*)", message, re.S)
        if m is not None and env_name(m.group(1)) in self.env and not self._on_command_line(m.group(1)):
            message = f"{env_name(m.group(1))} (the environment's {m.group(1)}): {m.group(2)}"
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def _on_command_line(self, flag: str) -> bool:
        """Was `flag` given (or an abbreviation argparse takes for it) before any `--`?"""
        for arg in self.given:
            if arg == "--":
                break
            name = arg.split("=", 1)[0]
            if name.startswith("--") and len(name) > 2 and flag.startswith(name):
                return True
        return False


def _listen_address(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. 0.0.0.0:{DEFAULT_PORT}), got {value!r}")
    if not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"port {int(port)} is out of range (0 to 65535) in {value!r}")
    return host.strip("[]"), int(port)


def _listen_addresses(value: str) -> tuple[tuple[str, int], ...]:
    """One or more HOST:PORT, separated by commas (an IPv6 host in brackets: [::1]:8081)."""
    items = [item.strip() for item in value.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"expected HOST:PORT[,HOST:PORT...] without empty items, got {value!r}")
    addresses = tuple(_listen_address(item) for item in items)
    if len(set(addresses)) < len(addresses):
        raise argparse.ArgumentTypeError(f"an address is given twice in {value!r}")
    return addresses


def _url(value: str) -> str:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  (ValueError for a port that is not a number from 0 to 65535)
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"expected an http(s) URL like http://127.0.0.1:8080, got {value!r}")
    return value.rstrip("/")


def url_value(value: str) -> str:
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


def bool_value(value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def on_off_value(value: str) -> bool:
    """An on|off flag's value (the words `bool_value` takes are taken too)."""
    try:
        return bool_value(value)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected on or off, got {value!r}") from None


USAGE = (
    "%(prog)s [--log-file PATH | --log-source stdin | --journal-unit UNIT | --servers-file FILE | --demo] "
    "[options]\n       %(prog)s diagnose [--json] [--html FILE] LOG...   (a past incident; diagnose --help)"
)


def env_name(flag: str) -> str:
    """The environment variable of a flag: `--log-file` → `LLAMACPP_EXPORTER_LOG_FILE`."""
    return ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_").replace(".", "_")


def shown_default(value: Any, metavar: str | None = None) -> str | None:
    """A default as `--help` and the docs write it (None for none): `on`/`off` for an on|off flag,
    `true`/`false` for another yes-or-no, `300` for 300.0, HOST:PORT for an address, a list with commas."""
    if value is None or value == ():
        return None
    if isinstance(value, bool):
        return ("on" if value else "off") if metavar == "on|off" else ("true" if value else "false")
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(value) if all(isinstance(v, str) for v in value) else f"{value[0]}:{value[1]}"
    return str(value)


class _Flags:
    """Adds flags whose default comes from the environment and whose help says what is in effect.

    Every flag's help ends with its default as it stands (the built-in one, from exporter/settings.py,
    or the environment's, named as such) and its environment variable in brackets, so `--help` run under
    a unit's or a container's environment shows what that exporter will do.
    """

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.defaults = flag_defaults()

    def add(
        self,
        group: argparse._ArgumentGroup,
        flag: str,
        text: str,
        *,
        shown: str | None = None,
        secret: bool = False,
        from_env_later: bool = False,
        empty_unset: bool = False,
        **kwargs: Any,
    ) -> None:
        """`flag` in `group`, its default its settings field's; `shown`: what the help says where there is none.

        `secret`: the variable's value is never shown; it and `from_env_later` leave the variable to be
        read after parsing (argparse gets no default).

        An empty environment value is a value (and an error where the flag's type refuses it), except
        where `empty_unset`.
        """
        var = env_name(flag)
        value = self.env.get(var)
        if value == "" and empty_unset:
            value = None
        if secret or from_env_later:  # read by config._api_key, so that a flag and a variable can be told apart
            note = shown if value is None else f"set by {var}" if secret else f"{value}, from {var}"
        elif value is not None:
            note = f"{value}, from {var}"
            kwargs.setdefault("default", value.lower() if kwargs.get("choices") else value)
        else:
            default = self.defaults.get(flag)
            note = shown_default(default, kwargs.get("metavar")) or shown
            kwargs.setdefault("default", default)
        text += (f" (default: {note})" if note else "") + f" [{var}]"
        group.add_argument(flag, help=text.replace("%", "%%"), dest=dest(flag), **kwargs)


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """The parser; defaults come from `env` so `--help` shows what is in effect.

    The groups follow the data: where the log lines come from, what llama-server's HTTP endpoints
    add, what the host adds (/proc, NVML), where /metrics is served, several servers, and output.
    """
    p = _OneLineParser(
        prog="llamacpp-exporter",
        usage=USAGE,
        add_help=False,
        description="Prometheus exporter and alerting sidecar for llama.cpp's llama-server: per-slot tokens, "
        "shared KV pool fill and overcommit, retry cascades and aborted requests from the server's log; "
        "live slot tokens from its /slots; VRAM and host memory from NVML and /proc.",
        epilog="Every flag can also be set through the environment variable shown in brackets (a flag wins). "
        "Run llama-server with --log-file PATH (or under systemd, or piped into standard input) and -lv 4 for "
        "the full picture: at the default -lv 3 the KV pool size and per-request prompt lines are hidden and "
        "estimated. Post-mortem of a log (what failed, when, and what to change): llamacpp-exporter diagnose "
        "LOG (see llamacpp-exporter diagnose --help).",
    )
    flags = _Flags(env)
    _add_log_flags(p, flags)
    _add_http_flags(p, flags)
    _add_host_flags(p, flags)
    _add_web_flags(p, flags)
    _add_guard_flags(p, flags)
    _add_output_flags(p, flags)
    p.env = env
    return p


def _add_web_flags(p: argparse.ArgumentParser, flags: _Flags) -> None:
    """Where /metrics is served and how it is protected; several servers."""
    web = p.add_argument_group("web and security", "where /metrics, the landing page / and /healthz are served")
    flags.add(
        web,
        "--listen-address",
        f"where to serve /metrics; 127.0.0.1:{DEFAULT_PORT} where only a local Prometheus scrapes.",
        type=_listen_address,
        metavar="HOST:PORT",
    )
    flags.add(
        web,
        "--web.config.file",
        "TLS, basic auth and response headers, in the YAML format of Prometheus' exporter-toolkit "
        "(the --web.config.file of node_exporter); re-read when it changes.",
        shown="none: plain HTTP, no auth",
        empty_unset=True,
        metavar="PATH",
    )
    several = p.add_argument_group(
        "several servers", "one exporter for several llama-servers (a router needs none of this: its log names them)"
    )
    flags.add(
        several,
        "--servers-file",
        "follow several llama-servers, each named with its log, URL and pid in a YAML file "
        "(servers: a list of name, log_file, url, pid or pid_file); their series get a server label. Replaces "
        "--log-file, --server-url, --pid and --pid-file.",
        metavar="FILE",
    )


def _add_output_flags(p: argparse.ArgumentParser, flags: _Flags) -> None:
    """The exporter's own log, help and version."""
    out = p.add_argument_group(
        "output", "the exporter's own log; a past incident is explained by llamacpp-exporter diagnose LOG..."
    )
    flags.add(
        out,
        "--log-level",
        "the exporter's own log level.",
        choices=LOG_LEVELS,
    )
    out.add_argument("-h", "--help", action="help", help="show this help (with the defaults in effect) and exit")
    out.add_argument("--version", action="version", version=f"%(prog)s {__version__}")


def _add_log_flags(p: argparse.ArgumentParser, flags: _Flags) -> None:
    """Where llama-server's lines come from, and how the file is followed."""
    g = p.add_argument_group(
        "log source",
        "llama-server's log: a file (its --log-file), standard input, or a systemd unit's journal; "
        "or --demo. Every metric of the log comes from here.",
    )
    flags.add(
        g,
        "--log-file",
        "llama-server's --log-file to follow, or - for standard input. Waited for if it does not exist yet.",
        shown="none: required unless --log-source stdin or journald, --servers-file or --demo",
        metavar="PATH",
    )
    flags.add(
        g,
        "--log-source",
        "where the lines come from: file (--log-file PATH), stdin (same as --log-file -), "
        "or journald (the systemd journal of --journal-unit).",
        shown="from the other flags",
        empty_unset=True,
        choices=LOG_SOURCES,
    )
    flags.add(
        g,
        "--journal-unit",
        "the systemd unit whose journal to follow, e.g. llama-server.service (implies --log-source journald). "
        "Needs read access to the journal (group systemd-journal).",
        metavar="UNIT",
    )
    flags.add(
        g,
        "--journal-namespace",
        "with --log-source journald: the journal namespace of a unit with LogNamespace=NAME.",
        metavar="NAME",
    )
    flags.add(
        g,
        "--journal-directory",
        "with --log-source journald: read the journal files in DIR (e.g. the host's /var/log/journal "
        "mounted into a container) instead of the local journal.",
        metavar="DIR",
    )
    _add_follow_flags(g, flags)


def _add_follow_flags(g: argparse._ArgumentGroup, flags: _Flags) -> None:
    """How a log file is followed; the demo."""
    flags.add(
        g,
        "--log-poll-interval",
        "how often to stat() the log even without filesystem events, in seconds (at most 3600).",
        type=_interval(3600),
        metavar="SECONDS",
    )
    flags.add(
        g,
        "--log-batch-interval",
        "the longest wait between reads while the log keeps growing: the wait starts at 0.025 s and doubles "
        "up to this (at most 10). Longer = fewer wake-ups and less CPU. A line after a quiet spell is read at "
        "once, and a scrape reads what the log holds first.",
        type=_interval(10),
        metavar="SECONDS",
    )
    flags.add(
        g,
        "--fs-events",
        "also wake on filesystem events (watchdog/inotify); false = polling only, for NFS and similar.",
        type=bool_value,
        metavar="BOOL",
    )
    flags.add(
        g,
        "--demo",
        "no llama-server needed: replay two recorded real llama-server logs (shipped with the package) "
        "in a loop at their recorded pace and export them.",
        action="store_true",
    )
    flags.add(
        g,
        "--demo-speed",
        "replay speed for --demo (1.0 = recorded pace).",
        type=_positive_float,
        metavar="FACTOR",
    )


def _add_http_flags(p: argparse.ArgumentParser, flags: _Flags) -> None:
    """llama-server's HTTP endpoints: /health (up, loading), /slots (live slot tokens), /props."""
    g = p.add_argument_group(
        "llama-server HTTP",
        "read at scrape time: /health (llamacpp_up), /slots (each slot's tokens as the server counts them; "
        "without it they are estimated from the log) and /props (build, model). A failing read sets "
        'llamacpp_exporter_source_up{source="http"} 0 and never fails the scrape.',
    )
    flags.add(
        g,
        "--server-url",
        "llama-server's HTTP address (also shown on the landing page).",
        type=_url,
        metavar="URL",
    )
    flags.add(
        g,
        "--http",
        "read /health, /slots, /props and /metrics at --server-url.",
        type=on_off_value,
        metavar="on|off",
    )
    flags.add(
        g,
        "--api-key",
        "llama-server's API key, sent as a Bearer token (/slots and /props need it when the server has "
        "one). Prefer --api-key-file or the environment: a flag shows in ps.",
        shown="set by LLAMA_API_KEY" if flags.env.get("LLAMA_API_KEY") else "none, else LLAMA_API_KEY",
        secret=True,
        metavar="KEY",
    )
    flags.add(
        g,
        "--api-key-file",
        "file with the API key: its first line that is neither empty nor a # comment, like llama-server's "
        "--api-key-file.",
        from_env_later=True,
        metavar="PATH",
    )
    flags.add(
        g,
        "--server-timeout",
        "time limit for each scrape's live reads (HTTP, /proc, NVML), in seconds, at most 30.",
        type=_timeout,
        metavar="SECONDS",
    )


def _add_host_flags(p: argparse.ArgumentParser, flags: _Flags) -> None:
    """What the host adds: NVML (VRAM), /proc (RSS, host memory, llama-server's command line)."""
    g = p.add_argument_group(
        "host sources",
        "read at scrape time: GPU memory and llama-server's own VRAM (NVML), its RSS, start time and command "
        "line (the KV pool size when the log hides it) and the host's memory (/proc). A failing source "
        "reports llamacpp_exporter_source_up{source} 0 and never fails the scrape.",
    )
    flags.add(
        g,
        "--nvml",
        "GPU memory per GPU and llama-server's own VRAM from NVML (nvidia-ml-py); without a GPU or driver "
        "the source reports down.",
        type=on_off_value,
        metavar="on|off",
    )
    flags.add(
        g,
        "--proc",
        "llama-server's RSS, start time and command line, and the host's MemAvailable, from /proc (psutil on "
        "Windows and macOS: --process-source).",
        type=on_off_value,
        metavar="on|off",
    )
    flags.add(
        g,
        "--proc-root",
        "where /proc is mounted, e.g. /host/proc in a container (checked only where the /proc source is used).",
        metavar="PATH",
    )
    flags.add(
        g,
        "--process-source",
        "how llama-server's process and the host's memory are read: procfs (Linux's /proc, under --proc-root), "
        "psutil (Windows, macOS), or auto: procfs where <proc-root>/self/stat is readable, else psutil.",
        choices=PROCESS_SOURCES,
    )
    flags.add(
        g,
        "--pid",
        "llama-server's pid.",
        shown="found automatically: the llama-server that writes or names --log-file or writes into standard "
        "input, else the only llama-server not known to write another log",
        type=positive_int,
        metavar="PID",
    )
    flags.add(g, "--pid-file", "file holding llama-server's pid, read at every scrape.", metavar="PATH")
    flags.add(
        g,
        "--kv-pool-capacity",
        "KV pool size to assume when neither the log nor llama-server's command line gives it (capacity_source=flag).",
        type=positive_int,
        metavar="TOKENS",
    )
    active = "seconds after its last turn that an idle slot's conversation counts as coming back "
    active += "(llamacpp_kv_pool_active_tokens): longer than the pauses between an agent's turns (its tool runs)."
    flags.add(g, "--kv-pool-active-window", active, type=_positive_float, metavar="SECONDS")


def _add_guard_flags(p: argparse.ArgumentParser, flags: _Flags) -> None:
    """The guard: an optional reverse proxy in front of llama-server that admits, queues and preempts."""
    g = p.add_argument_group(
        "guard",
        "optional: clients talk to the guard instead of llama-server (--server-url); it passes everything on "
        "unchanged, but sends a generation request only when its prompt and budget fit the KV pool next to "
        "those in flight, so that no request is aborted for another one's size (docs/guard.md).",
    )
    flags.add(
        g,
        "--guard.listen-address",
        "where the guard listens, e.g. :8081, or several addresses separated by commas, e.g. "
        "127.0.0.1:8081,[::1]:8081 (each is bound, or the exporter does not start); clients point at it "
        "instead of llama-server.",
        type=_listen_addresses,
        shown="none: no guard",
        empty_unset=True,
        metavar="HOST:PORT[,HOST:PORT...]",
    )
    flags.add(
        g,
        "--guard.default-budget",
        "generation tokens counted for a request that sets no n_predict/max_tokens (capped at its slot's window).",
        type=positive_int,
        metavar="TOKENS",
    )
    flags.add(
        g,
        "--guard.queue-size",
        "requests that may wait for room at most; one more is answered 429 with Retry-After.",
        type=positive_int,
        metavar="N",
    )
    flags.add(
        g,
        "--guard.queue-timeout",
        "the longest wait in the guard, in seconds (for room in the KV pool, or for llama-server to be ready "
        "again); past it, or when the wait is predicted to be longer, the request is answered 503 with "
        "Retry-After. The default is half the openai and anthropic SDKs' own request timeout.",
        type=_positive_float,
        metavar="SECONDS",
    )
    _add_guard_client_flags(g, flags)
    add_client_flags(g, flags)  # who fills the pool: client names, the access log, admission on or off


def _add_guard_client_flags(g: argparse._ArgumentGroup, flags: _Flags) -> None:
    """What the guard accepts from a client: body size, connections, slow heads and idle keep-alives."""
    flags.add(
        g,
        "--guard.max-body-bytes",
        "the largest request body the guard accepts (413 past it).",
        type=positive_int,
        metavar="BYTES",
    )
    flags.add(
        g,
        "--guard.max-connections",
        "client connections open at once at most (fewer where the file descriptor limit needs it: each may hold "
        "one to llama-server); past it the oldest one that has not sent its request is closed, else new ones "
        "wait to be accepted.",
        type=positive_int,
        metavar="N",
    )
    flags.add(
        g,
        "--guard.head-timeout",
        "seconds a client has to send a request's head, from its connection or the head's first byte, and the "
        "longest pause between two bytes of its body (answered 408); past either the client is disconnected "
        "(a body that keeps coming, and the answer, take as long as they need).",
        type=_positive_float,
        metavar="SECONDS",
    )
    flags.add(
        g,
        "--guard.keepalive-timeout",
        "seconds an idle keep-alive connection stays open between two requests.",
        type=_positive_float,
        metavar="SECONDS",
    )
    flags.add(
        g,
        "--guard.connect-timeout",
        "seconds the guard waits for a connection to llama-server to open; past it llama-server counts as "
        "unreachable: a generation request waits for it (within --guard.queue-timeout), another is answered 502.",
        type=_positive_float,
        metavar="SECONDS",
    )
