"""The settings: one frozen dataclass per area (the groups of `--help`), whose defaults are the only ones.

Each field names its flag: `flag("--guard.queue-timeout", 300.0)`. From that one place exporter/flags.py
takes the flag's default and the "(default: …)" of `--help`, and exporter/config.py builds each area from
the parsed flags (the flag's argparse `dest` is its name, `dest("--guard.queue-timeout")`). The README's
flag table and docs/guard.md's are checked against these fields (tests/unit/test_settings.py).

Light on purpose: `--help` and a flag's error import this, and nothing of the serving code.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from exporter.model.clients import CLIENT_SOURCES

DEFAULT_PORT = 9778  # not 8080/9090/9093/9100/3000; the 9100-9999 exporter range has no free registration left
DEFAULT_PROC_ROOT = "/proc"

T = TypeVar("T")


def flag(name: str, default: Any, *, derived: bool = False, secret: bool = False) -> Any:
    """A field set by the flag `name`, with its one default.

    `derived`: the value is worked out from several flags (exporter/config.py), so the flag itself has no
    default and `--help` says how it is found. `secret`: never shown (repr included)."""
    return field(default=default, repr=not secret, metadata={"flag": name, "derived": derived})


def dest(flag_name: str) -> str:
    """The argparse `dest` of a flag: `--guard.queue-timeout` → `guard_queue_timeout`."""
    return flag_name.lstrip("-").replace("-", "_").replace(".", "_")


@dataclass(frozen=True)
class LogArea:
    """log source: where llama-server's lines come from, how a file is followed, the demo."""

    file: str | None = flag("--log-file", None)
    #: "file" (--log-file PATH), "stdin" (--log-file -) or "journald" (--journal-unit).
    source: str = flag("--log-source", "file", derived=True)
    journal_unit: str | None = flag("--journal-unit", None)
    journal_namespace: str | None = flag("--journal-namespace", None)
    journal_directory: str | None = flag("--journal-directory", None)
    poll_interval: float = flag("--log-poll-interval", 1.0)
    batch_interval: float = flag("--log-batch-interval", 2.0)
    fs_events: bool = flag("--fs-events", True)
    demo: bool = flag("--demo", False)
    demo_speed: float = flag("--demo-speed", 1.0)


@dataclass(frozen=True)
class HttpArea:
    """llama-server HTTP: its endpoints, read at scrape time."""

    server_url: str = flag("--server-url", "http://127.0.0.1:8080")
    enabled: bool = flag("--http", True)
    #: From --api-key, --api-key-file, their variables or LLAMA_API_KEY (exporter/config.py); never printed.
    api_key: str | None = flag("--api-key", None, derived=True, secret=True)
    #: The time limit of each scrape's live reads: HTTP, /proc and NVML alike.
    server_timeout: float = flag("--server-timeout", 2.0)


@dataclass(frozen=True)
class HostArea:
    """host sources: NVML, /proc (psutil where there is none), llama-server's process."""

    nvml: bool = flag("--nvml", True)
    proc: bool = flag("--proc", True)
    proc_root: str = flag("--proc-root", DEFAULT_PROC_ROOT)
    process_source: str = flag("--process-source", "auto")  # auto, procfs or psutil
    pid: int | None = flag("--pid", None)
    pid_file: str | None = flag("--pid-file", None)
    kv_pool_capacity: int | None = flag("--kv-pool-capacity", None)
    kv_pool_active_window: float = flag("--kv-pool-active-window", 60.0)


@dataclass(frozen=True)
class WebArea:
    """web and security: where /metrics is served, and how it is protected."""

    listen_address: tuple[str, int] = flag("--listen-address", ("0.0.0.0", DEFAULT_PORT))
    config_file: str | None = flag("--web.config.file", None)

    @property
    def host(self) -> str:
        return self.listen_address[0]

    @property
    def port(self) -> int:
        return self.listen_address[1]


@dataclass(frozen=True)
class GuardArea:
    """guard: the proxy in front of llama-server (off without a listen address).

    The fields the guard's own `GuardSettings` has carry its names, so `guard_settings` builds it from
    them without a list of its own."""

    listen_address: tuple[tuple[str, int], ...] = flag("--guard.listen-address", ())
    default_budget: int = flag("--guard.default-budget", 1024)
    max_queue: int = flag("--guard.queue-size", 64)
    #: Half the `openai` and `anthropic` SDKs' default request timeout (600 s): the rest is for the answer.
    max_wait: float = flag("--guard.queue-timeout", 300.0)
    max_body_bytes: int = flag("--guard.max-body-bytes", 64 * 1024 * 1024)
    max_connections: int = flag("--guard.max-connections", 256)
    #: The deadline of a request's head, and the longest pause between two bytes of its body.
    head_timeout: float = flag("--guard.head-timeout", 10.0)
    keepalive_timeout: float = flag("--guard.keepalive-timeout", 75.0)
    #: How long a connection to llama-server may take to open (aiohttp's sock_connect).
    connect_timeout: float = flag("--guard.connect-timeout", 10.0)
    #: False: every request is sent at once (no queue, no preemption); the books by client still run.
    admission: bool = flag("--guard.admission", True)

    @property
    def listen(self) -> tuple[str, int] | None:
        """The first address, or None: no guard."""
        return self.listen_address[0] if self.listen_address else None

    @property
    def listen_also(self) -> tuple[tuple[str, int], ...]:
        return self.listen_address[1:]


@dataclass(frozen=True)
class ClientOptions:
    """guard, clients: how the guard names clients and where it logs each request."""

    sources: tuple[str, ...] = flag("--guard.client-from", CLIENT_SOURCES)
    header: str | None = flag("--guard.client-header", None)
    keys_file: str | None = flag("--guard.client-keys-file", None)
    max_clients: int = flag("--guard.max-clients", 16)
    access_log: str | None = flag("--guard.access-log", None)
    access_log_max_bytes: int = flag("--guard.access-log-max-bytes", 64 * 1024 * 1024)


@dataclass(frozen=True)
class OutputArea:
    """output: the exporter's own log."""

    log_level: str = flag("--log-level", "info")


AREAS: tuple[type, ...] = (LogArea, HttpArea, HostArea, WebArea, GuardArea, ClientOptions, OutputArea)


def flag_defaults() -> dict[str, Any]:
    """Each flag's default, from its field (a derived field's flag has none: None)."""
    return {f.metadata["flag"]: None if f.metadata["derived"] else f.default for area in AREAS for f in fields(area)}


def area_of(area: type[T], values: Any, **checked: Any) -> T:
    """`area` built from `values` (parsed flags: an attribute per `dest`); `checked` wins where given."""
    given = {f.name: getattr(values, dest(f.metadata["flag"])) for f in fields(area)}  # type: ignore[arg-type]
    return area(**{**given, **checked})
