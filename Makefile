# Developer entry points. `make test` is what CI runs (.ci/run).
.PHONY: bootstrap demo test lint

# Everything: .venv, Python deps, Prometheus tools, the real llama-server (~5 min the first time).
bootstrap:
	scripts/bootstrap.sh

# Runs the exporter against its built-in demo data; needs only the Python dependencies.
demo:
	scripts/bootstrap.sh --python-only
	.venv/bin/llamacpp-exporter --demo

test:
	scripts/test.sh

lint:
	scripts/bootstrap.sh --python-only
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
