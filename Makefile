# Developer entry points. CI (.ci/run) runs `make test`, then `make test-system`.
.PHONY: bootstrap demo test test-fast test-portable test-system lint regen

# Everything: .venv, Python deps, test tools, the real llama-server (~5 min the first time).
bootstrap:
	scripts/bootstrap.sh

# Runs the exporter against its built-in demo data (http://localhost:9778/). Installs the package and
# its dependencies alone into .venv (no test tools, never root): about 5 MB to download, 46 MB in
# .venv, the first /metrics about 20 s after a fresh clone (README: "What make demo and make test do").
demo:
	scripts/bootstrap.sh --package-only
	.venv/bin/llamacpp-exporter --demo

test:
	scripts/test.sh

# The fast loop: tests/unit only (in process: no llama-server, promtool or other program), well under a
# minute on 2 cores; no lint. `make test` runs these too, with everything else.
test-fast:
	scripts/bootstrap.sh --python-only
	.venv/bin/python -m pytest -p no:cacheprovider -q tests/unit

# The second configuration alone: what Windows' and macOS' Python lack taken away (docs/testing.md). `make test`
# runs it too, after the first pass.
test-portable:
	scripts/bootstrap.sh
	scripts/test-portable.sh

# The journald and systemd unit tests: root, and systemd's programs (installed where missing).
test-system:
	scripts/test-system.sh

lint:
	scripts/bootstrap.sh --python-only
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

# Every generated file made again from its sources (rules, dashboard, Kubernetes manifests, docs tables:
# scripts/regen.py lists them); the fast loop fails while one is stale.
regen:
	scripts/bootstrap.sh --python-only
	.venv/bin/python scripts/regen.py
