"""The command line of generate_rules.py: settings from --set and the link flags, the files it writes."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from llamacpp_rules.config import Config
from llamacpp_rules.docs_table import DOCS_FILE, docs_with_table
from llamacpp_rules.document import render

RULES_FILE = Path(__file__).resolve().parent.parent / "llamacpp-rules.yml"


def _parse_set(cfg: Config, items: list[str]) -> Config:
    """``cfg`` changed by ``--set KEY=VALUE`` items (a bad key or value: a one-line error)."""
    types = {f.name: f.type for f in fields(Config)}
    changes: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in types:
            raise SystemExit(
                f"generate_rules.py: error: --set {item!r}: expected KEY=VALUE with KEY one of {sorted(types)}"
            )
        kind = types[key]
        try:
            changes[key] = int(value) if kind == "int" else float(value) if kind == "float" else value
        except ValueError:
            raise SystemExit(f"generate_rules.py: error: --set {item!r}: {key} must be a {kind}") from None
    return dataclasses.replace(cfg, **changes)


def main(argv: list[str] | None = None) -> int:
    """Write the rules file (and, with the default output, the docs' alert table), or --check them."""
    parser = argparse.ArgumentParser(description="Render the Prometheus rules for llamacpp-exporter.")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting")
    parser.add_argument(
        "--runbook-url", metavar="URL", help="where alerts/runbook.md is published (absolute http(s) URL)"
    )
    parser.add_argument("--grafana-url", metavar="URL", help="Grafana's address (absolute http(s) URL)")
    parser.add_argument(
        "-o", "--output", type=Path, default=RULES_FILE, help=f"default {RULES_FILE} (and the docs' alert table)"
    )
    parser.add_argument("--list", action="store_true", help="print every setting with its default and exit")
    parser.add_argument("--check", action="store_true", help="exit 1 if the output file differs from the rendering")
    args = parser.parse_args(argv)
    if args.list:
        for f in fields(Config):
            print(f"{f.name}={getattr(Config(), f.name)}")
        return 0
    cfg = _parse_set(Config(), args.set)
    urls = {"runbook_url": args.runbook_url, "grafana_url": args.grafana_url}
    cfg = dataclasses.replace(cfg, **{k: v for k, v in urls.items() if v is not None})
    try:
        text = render(cfg)
    except ValueError as exc:
        raise SystemExit(f"generate_rules.py: error: {exc}") from None
    # The docs describe the defaults: their table is rewritten with the committed rules file only.
    docs = args.output.resolve() == RULES_FILE and DOCS_FILE.exists()
    wanted = {args.output: text}
    if docs:
        wanted[DOCS_FILE] = docs_with_table(DOCS_FILE.read_text(encoding="utf-8"), cfg)
    if args.check:
        stale = [p for p, t in wanted.items() if not p.exists() or p.read_text(encoding="utf-8") != t]
        for path in stale:
            print(f"{path} is not up to date: run python alerts/generate_rules.py", file=sys.stderr)
        return 1 if stale else 0
    for path, content in wanted.items():
        path.write_text(content, encoding="utf-8")
    return 0
