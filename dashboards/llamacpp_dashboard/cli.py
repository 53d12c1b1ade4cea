"""The command line of generate_dashboard.py: write the dashboard's JSON, or check that it is up to date."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llamacpp_dashboard.dashboard import render

DASHBOARD_FILE = Path(__file__).resolve().parent.parent / "llamacpp.json"


def main(argv: list[str] | None = None) -> int:
    """Write dashboards/llamacpp.json (or --output), or --check it; 0 when done or up to date."""
    parser = argparse.ArgumentParser(description="Render the Grafana dashboard for llamacpp-exporter.")
    parser.add_argument("-o", "--output", type=Path, default=DASHBOARD_FILE, help=f"default {DASHBOARD_FILE}")
    parser.add_argument("--check", action="store_true", help="exit 1 if the output file differs from the rendering")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is not up to date: run python dashboards/generate_dashboard.py", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    return 0
