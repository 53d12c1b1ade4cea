"""`--servers-file FILE`: several llama-servers followed by one exporter, named in a small YAML file.

    servers:
      - name: gpu0                        # the `server` label: letters, digits, `_`, `-`, `.` (64 at most)
        log_file: /var/log/llama/gpu0.log # its --log-file (required)
        url: http://127.0.0.1:8080        # its HTTP endpoints (optional: without one, none are read)
        pid_file: /run/llama/gpu0.pid     # or pid: 1234 (optional: else found by the log file)
      - name: gpu1
        log_file: /var/log/llama/gpu1.log
        url: http://127.0.0.1:8081

Every other flag (`--api-key`, `--server-timeout`, `--no-nvml`, …) applies to all of them. A router is
one entry: its children are found in its log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Servers one exporter follows at most.
MAX_SERVERS = 64
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_KEYS = {"name", "log_file", "url", "pid", "pid_file"}


class ServersFileError(ValueError):
    """What is wrong with the file, in one line."""


@dataclass(frozen=True)
class ServerSpec:
    """One server of the file."""

    name: str
    log_file: str
    url: str | None = None
    pid: int | None = None
    pid_file: str | None = None


def _text(entry: dict[str, Any], key: str, where: str, *, required: bool = False) -> str | None:
    value = entry.get(key)
    if value is None:
        if required:
            raise ServersFileError(f"{where}: {key} is required")
        return None
    if not isinstance(value, str) or not value.strip():
        raise ServersFileError(f"{where}: {key} must be a non-empty string")
    return value


def parse_servers(text: str, check_url: Any = None) -> tuple[ServerSpec, ...]:
    """The servers of a servers file's text; raises ServersFileError naming the entry and key."""
    import yaml  # only where a servers file is used: it costs the exporter ~1.5 MiB of memory

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ServersFileError(f"not YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, dict) or set(doc) != {"servers"}:
        raise ServersFileError("expected one top-level key, servers: a list of servers")
    entries = doc["servers"]
    if not isinstance(entries, list) or not entries:
        raise ServersFileError("servers: expected a list of at least one server")
    if len(entries) > MAX_SERVERS:
        raise ServersFileError(f"{len(entries)} servers: at most {MAX_SERVERS}")
    specs: list[ServerSpec] = []
    for i, entry in enumerate(entries, 1):
        where = f"server {i}"
        if not isinstance(entry, dict):
            raise ServersFileError(f"{where}: expected a mapping (name, log_file, url, pid or pid_file)")
        unknown = sorted(set(entry) - _KEYS)
        if unknown:
            raise ServersFileError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})")
        name = _text(entry, "name", where, required=True)
        assert name is not None
        if not _NAME.fullmatch(name):
            raise ServersFileError(f"{where}: name {name!r}: letters, digits, '_', '-', '.' only, 64 at most")
        where = f"server {name!r}"
        if any(s.name == name for s in specs):
            raise ServersFileError(f"{where}: the name is used twice")
        log_file = _text(entry, "log_file", where, required=True)
        assert log_file is not None
        url = _text(entry, "url", where)
        if url is not None and check_url is not None:
            try:
                url = check_url(url)
            except ValueError as exc:
                raise ServersFileError(f"{where}: url: {exc}") from None
        pid = entry.get("pid")
        if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0):
            raise ServersFileError(f"{where}: pid must be a positive whole number")
        pid_file = _text(entry, "pid_file", where)
        if pid is not None and pid_file is not None:
            raise ServersFileError(f"{where}: pid and pid_file: give one of them")
        if any(s.log_file == log_file for s in specs):
            raise ServersFileError(f"{where}: log_file {log_file!r} is followed twice")
        specs.append(ServerSpec(name, log_file, url, pid, pid_file))
    return tuple(specs)


def read_servers_file(path: str, check_url: Any = None) -> tuple[ServerSpec, ...]:
    """`parse_servers` of a file; an unreadable file is a ServersFileError too."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise ServersFileError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ServersFileError(f"{path!r} is not UTF-8 text") from None
    return parse_servers(text, check_url)
