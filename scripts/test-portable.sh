#!/usr/bin/env bash
# The suite's portable configuration: what Windows' (and partly macOS') Python lacks taken away on Linux
# (tests/support/portable_loop.py: no resource, fcntl, os.sysconf/fork/pread; an event loop that refuses
# add_reader and add_signal_handler as Windows' proactor loop does; the process source on psutil; watchdog's
# polling observer), then the exporter's, the guard's and diagnose's tests again. Every Python started
# with tests/support/portable on PYTHONPATH gets it: pytest and each exporter process the tests start.
# Tests of Linux-only code (marked `linux`: inotify) and `system` ones are left out. Extra arguments go
# to pytest. scripts/test.sh runs it after the first pass (on a busy 2-core host: 953 tests, about 6 minutes).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

TESTS=(
    tests/unit
    tests/real_server/test_portable_start.py
    tests/real_server/test_help.py
    tests/real_server/test_cli.py
    tests/real_server/test_wrong_log.py
    tests/real_server/test_stdin.py
    tests/real_server/test_diagnose_cli.py
    tests/real_server/test_diagnose_history.py
    tests/real_server/test_hostile_input_exporter.py
    tests/real_server/test_sources_config.py
    tests/real_server/test_servers_cli.py
    tests/real_server/test_end_to_end.py
    tests/real_server/test_guard_e2e.py
)
PYTHONPATH="$ROOT/tests/support/portable${PYTHONPATH:+:$PYTHONPATH}" \
    exec .venv/bin/python -m pytest -m "not system and not linux" "${TESTS[@]}" "$@"
