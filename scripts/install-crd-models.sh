#!/usr/bin/env bash
# The Prometheus Operator CRD schemas (PyPI cloudcoil-models-prometheus-operator) as pydantic models,
# for tests/real_server/test_deploy_kubernetes.py: installed into .venv/crd-models and NOT into the venv's
# site-packages, because the package registers a pytest plugin whose imports we do not install.
# Safe to run again. Env: PYTHON (default .venv/bin/python).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
CRD_MODELS_VERSION="0.80.1.0"
CRD_DIR="$ROOT/.venv/crd-models"

stamp="$CRD_DIR/.installed-$CRD_MODELS_VERSION"
if [[ ! -f "$stamp" ]]; then
    rm -rf "$CRD_DIR"
    "$PY" -m pip install --quiet --disable-pip-version-check --target "$CRD_DIR" \
        "cloudcoil-models-prometheus-operator==$CRD_MODELS_VERSION"
    touch "$stamp"
fi
