#!/usr/bin/env python3
"""Render alerts/llamacpp-rules.yml: the Prometheus recording and alerting rules for llamacpp-exporter.

The committed rules file is this script's output with the defaults below, and the alert table in
docs/alerts-and-dashboards.md is rendered from the same rules; a test checks that both agree.
Thresholds, ``for:`` durations, the series selector and where the runbook and Grafana are (every
alert links to both, by absolute URL) are settings:

    python alerts/generate_rules.py           # rewrite alerts/llamacpp-rules.yml and the docs' alert table
    python alerts/generate_rules.py -o my-rules.yml --runbook-url https://git.mycorp.net/ops/llamacpp/runbook.md \
        --grafana-url https://grafana.mycorp.net --set vram_free_bytes=1073741824 --set selector='job="llama"'
    python alerts/generate_rules.py --list    # every setting with its default

Severity policy (alerts/runbook.md, "Severity policy"): ``critical`` pages where requests are being lost
(LlamaCppKVPoolRequestsAborted) or the pool is past 90 % (LlamaCppKVPoolSaturated), at once and kept up
with ``keep_firing_for``, one page per incident; or where nothing watches or serves any more. No alert fires
on one sample, whatever the scrape and evaluation intervals. ``warning`` is work for the day (the
seconds-ahead forecast is the guard's signal and a warning); ``info`` is context; LlamaCppWatchdog always
fires (severity ``none``), for a dead man's switch. Without --runbook-url/--grafana-url no link is rendered
(each description names its runbook section); a placeholder or loopback address is refused.

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
