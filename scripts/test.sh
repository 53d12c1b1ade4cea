#!/usr/bin/env bash
# Bootstrap, then lint, type-check and test. Extra arguments go to pytest.
#
# Changes nothing outside the checkout but ~/.cache/llamacpp-exporter (the test tools and the
# llama-server build); the tests that need systemd and root are `make test-system`'s.
#
# Every check runs even when an earlier one fails, so one run reports everything; the exit status
# is non-zero if any failed. Under CI (env CI set) the test fixtures fail, rather than skip, when
# llama-server or promtool is missing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

scripts/bootstrap.sh

failed=()
step() {
    local name="$1"
    shift
    echo "==> $name: $*" >&2
    local t0=$SECONDS
    if "$@"; then
        echo "==> $name: ok ($((SECONDS - t0)) s)" >&2
    else
        echo "==> $name: FAILED (exit $?)" >&2
        failed+=("$name")
    fi
}

step ruff-check .venv/bin/ruff check .
step ruff-format .venv/bin/ruff format --check .
step mypy .venv/bin/mypy
step pytest .venv/bin/python -m pytest -m "not system" "$@"

if ((${#failed[@]})); then
    echo "test.sh: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "test.sh: all checks passed" >&2
