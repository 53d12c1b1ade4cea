#!/usr/bin/env bash
# Install what the deployment tests (tests/test_deploy_*.py, tests/test_journald.py) need and pip's
# test extra does not bring: safe to run again (each step is skipped when already done).
#
#   - docker-compose (Debian, 1.29.2): a real Compose implementation for `docker-compose config`
#   - systemd (Debian): journalctl, systemd-journald (the tests start a private, namespaced one) and
#     systemd-analyze (unit file checks). Installing the package starts nothing in a container.
#   - cloudcoil-models-prometheus-operator (PyPI): the Prometheus Operator CRD schemas as pydantic
#     models, installed into .venv/crd-models and NOT into the venv's site-packages, because the
#     package registers a pytest plugin whose imports we do not install.
#
# Env: PYTHON (default .venv/bin/python).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
CRD_MODELS_VERSION="0.80.1.0"
CRD_DIR="$ROOT/.venv/crd-models"

need=()
command -v docker-compose >/dev/null || need+=(docker-compose)
if ! command -v journalctl >/dev/null || ! command -v systemd-analyze >/dev/null ||
    { [[ ! -x /lib/systemd/systemd-journald ]] && [[ ! -x /usr/lib/systemd/systemd-journald ]]; }; then
    need+=(systemd)
fi
if ((${#need[@]})); then
    SUDO=""
    [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

stamp="$CRD_DIR/.installed-$CRD_MODELS_VERSION"
if [[ ! -f "$stamp" ]]; then
    rm -rf "$CRD_DIR"
    "$PY" -m pip install --quiet --disable-pip-version-check --target "$CRD_DIR" \
        "cloudcoil-models-prometheus-operator==$CRD_MODELS_VERSION"
    touch "$stamp"
fi
docker-compose version --short 2>/dev/null | head -1
