#!/usr/bin/env python3
"""Render dashboards/llamacpp.json, the Grafana dashboard for llamacpp-exporter.

The committed JSON is this script's output; a test checks that they agree, round-trips the JSON
through grafana-foundation-sdk, and runs every query against a real Prometheus after a real incident.

    python dashboards/generate_dashboard.py            # rewrite dashboards/llamacpp.json
    python dashboards/generate_dashboard.py --check    # exit 1 if the JSON is not up to date

Conventions (grafana/dashboard-linter): one ``datasource`` variable, multi-select ``job`` and
``instance`` variables, every query filtered by both, ``$__rate_interval`` for rates, units and a
description naming the metric on every panel, a stable ``uid``. Standard library only.

Many servers per exporter: the ``server`` and ``model`` variables (several servers on one exporter carry
``server``, a router's children ``model``; a lone server neither) filter every per-server query, and every
aggregation and legend keeps both; GPU and host memory are per host and stay unfiltered.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The dashboard is built by the llamacpp_dashboard package beside this script. Run as a script, its
# folder is on sys.path; loaded by path (the tests), it is not yet.
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))

from llamacpp_dashboard.cli import DASHBOARD_FILE, main  # noqa: E402
from llamacpp_dashboard.dashboard import build, render  # noqa: E402

__all__ = ["DASHBOARD_FILE", "build", "main", "render"]

if __name__ == "__main__":
    sys.exit(main())
