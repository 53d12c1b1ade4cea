"""The committed Grafana dashboard (dashboards/llamacpp.json) as JSON: its panels and rows in order."""

from __future__ import annotations

import json
from typing import Any

from paths import REPO

DASHBOARD = REPO / "dashboards" / "llamacpp.json"


def dashboard_json() -> dict[str, Any]:
    """The whole dashboard."""
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return doc


def panels_json() -> list[dict[str, Any]]:
    """Every panel but the rows."""
    return [p for p in dashboard_json()["panels"] if p["type"] != "row"]


def rows_json() -> list[tuple[str, list[dict[str, Any]]]]:
    """(row title, its panels) in order."""
    rows: list[tuple[str, list[dict[str, Any]]]] = []
    for p in dashboard_json()["panels"]:
        if p["type"] == "row":
            rows.append((p["title"], []))
        else:
            rows[-1][1].append(p)
    return rows


def guard_row_json() -> list[dict[str, Any]]:
    """The guard's row's panels."""
    (panels,) = [panels for title, panels in rows_json() if title.startswith("Guard")]
    return panels
