"""deploy/systemd's units read as systemd reads them (sections, repeated keys, quoting)."""

from __future__ import annotations

import shlex
from pathlib import Path

from paths import REPO

UNITS = REPO / "deploy" / "systemd"
SERVER_UNIT = UNITS / "llama-server.service"
EXPORTER_UNIT = UNITS / "llamacpp-exporter.service"


def unit_settings(path: Path) -> dict[str, dict[str, list[str]]]:
    """Section → key → values (a key may repeat, like Environment=), comments and blank lines dropped."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}: {line!r} outside a section"
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def exec_start(path: Path) -> list[str]:
    """ExecStart= split as systemd splits it."""
    (line,) = unit_settings(path)["Service"]["ExecStart"]
    return shlex.split(line)


def environment(path: Path) -> dict[str, str]:
    """Every Environment= assignment of the service."""
    env: dict[str, str] = {}
    for value in unit_settings(path)["Service"].get("Environment", []):
        for assignment in shlex.split(value):
            key, _, val = assignment.partition("=")
            env[key] = val
    return env
