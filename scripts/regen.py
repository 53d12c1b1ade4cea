#!/usr/bin/env python3
"""Every generated file in the repository, made again from its sources (`make regen`) or checked (`--check`).

    .venv/bin/python scripts/regen.py            # run every generator, in order
    .venv/bin/python scripts/regen.py --check    # exit 1 naming each generated file that is stale

Each generator is a script of its own with a `--check` of its own; this is the one list of them, in the
order they depend on each other (the Kubernetes manifests embed the rules and the dashboard), used by
`make regen` and by tests/unit/test_generated_files.py. The log goldens are not here: they are the
expected expositions, written on purpose with `tests/support/log_goldens.py --write` when a change to
what the exporter exposes is meant (docs/architecture.md, "Recipes").
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: `exporter` this checkout's, not that of a shared environment
    sys.path.insert(0, str(REPO))


class Generator(NamedTuple):
    """One generator: what it makes, its script, the arguments that write and those that check."""

    makes: str
    script: str
    write: tuple[str, ...]
    check: tuple[str, ...]


GENERATORS: tuple[Generator, ...] = (
    Generator(
        "alerts/llamacpp-rules.yml and docs/alerts-and-dashboards.md's alert table",
        "alerts/generate_rules.py",
        (),
        ("--check",),
    ),
    Generator("dashboards/llamacpp.json", "dashboards/generate_dashboard.py", (), ("--check",)),
    Generator(
        "deploy/kubernetes/prometheusrule.yaml and grafana-dashboards.yaml (from the two above)",
        "deploy/kubernetes/generate.py",
        (),
        ("--check",),
    ),
    Generator("docs/metric-list.md (from the metric catalogue)", "scripts/metric_list.py", (), ("--check",)),
    Generator(
        "docs/builds.md's tables (from the captures)",
        "tests/support/build_corpus.py",
        ("--docs",),
        ("--docs", "--check"),
    ),
)


def run(generator: Generator, *, check: bool) -> tuple[int, str]:
    """Run one generator's ``main`` (its check when ``check``) in this process; its exit status and output.

    In process, not as a program: the unit tests run these checks, and a unit test starts no program."""
    path = REPO / generator.script
    name = f"regen_{path.parent.name}_{path.stem}"
    module = sys.modules.get(name)
    if module is None:
        if str(path.parent) not in sys.path:
            sys.path.append(str(path.parent))  # what running the script would put first: its own folder
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None, path
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = module.main(list(generator.check if check else generator.write))
    return int(code or 0), out.getvalue()


def main(argv: list[str] | None = None) -> int:
    check = (sys.argv[1:] if argv is None else argv) == ["--check"]
    failed = 0
    for generator in GENERATORS:
        code, output = run(generator, check=check)
        if code != 0:
            failed += 1
            what = "stale" if check else "failed"
            print(f"{generator.makes}: {what} ({generator.script}):\n{output}".rstrip(), file=sys.stderr)
        elif not check:
            print(f"made {generator.makes}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
