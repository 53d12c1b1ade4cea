#!/usr/bin/env python3
"""Render alerts/llamacpp-rules.yml: the Prometheus recording and alerting rules for llamacpp-exporter.

The committed rules file is this script's output with the defaults below, and the alert table in
docs/alerts-and-dashboards.md is rendered from the same rules; a test checks that both agree.
Thresholds, ``for:`` durations, the series selector and where the runbook and Grafana are (every
alert links to both, by absolute URL) are settings:

    python alerts/generate_rules.py           # rewrite alerts/llamacpp-rules.yml and the docs' alert table
    python alerts/generate_rules.py -o my-rules.yml --runbook-url https://git.example.org/ops/llamacpp/runbook.md \
        --grafana-url https://grafana.example.org --set vram_free_bytes=1073741824 --set selector='job="llama"'
    python alerts/generate_rules.py --list    # every setting with its default

Severity policy (alerts/runbook.md, "Severity policy"): ``critical`` pages, and only where a person must
act now and can; every page needs its condition at two evaluations in a row at least (a ``for:``) or
is itself a repeat (three starts in 15 minutes). ``warning`` is work for the day (chat, a ticket);
``info`` is context for the dashboard and the next sizing. A forecast that the guard (a request-path
proxy) acts on by itself is not a page: with a guard, LlamaCppKVPoolOverflowAhead becomes its work.

Only the Python standard library and PyYAML are needed.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The rules are built by the llamacpp_rules package beside this script. Run as a script, its folder is
# on sys.path; loaded by path (the tests, deploy/kubernetes/generate.py), it is not yet.
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))

from llamacpp_rules.cli import RULES_FILE, main  # noqa: E402
from llamacpp_rules.config import Config  # noqa: E402
from llamacpp_rules.docs_table import DOCS_FILE, TABLE_BEGIN, TABLE_END, alert_table, docs_with_table  # noqa: E402
from llamacpp_rules.document import build, render  # noqa: E402
from llamacpp_rules.text import WHO  # noqa: E402

__all__ = [
    "DOCS_FILE",
    "RULES_FILE",
    "TABLE_BEGIN",
    "TABLE_END",
    "WHO",
    "Config",
    "alert_table",
    "build",
    "docs_with_table",
    "main",
    "render",
]

if __name__ == "__main__":
    sys.exit(main())
