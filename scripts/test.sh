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
# The second configuration: what Windows' and macOS' Python lack taken away (scripts/test-portable.sh).
# Left out when pytest is given arguments (a narrowed run); LLAMACPP_EXPORTER_PORTABLE_PASS=1 runs it anyway.
if (($# == 0)) || [[ "${LLAMACPP_EXPORTER_PORTABLE_PASS:-}" == 1 ]]; then
    step pytest-portable scripts/test-portable.sh
fi

if ((${#failed[@]})); then
    echo "test.sh: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "test.sh: all checks passed" >&2
