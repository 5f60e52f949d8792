#!/usr/bin/env bash
# Install guidellm once per version into its own venv, cached outside the clone, for
# bench/guidellm_ab.py (docs/clients.md). The last stdout line is the venv's python:
#   PY=$(scripts/install-guidellm.sh | tail -1)
# Env: DGXMM_CACHE_DIR (default /var/cache/dgxmm, or ~/.cache/dgxmm when that is not writable),
#      PYTHON (default python3; 3.11 for the local torch wheel). Needs python3-venv.
set -euo pipefail

# guidellm requires torch (and transformers, datasets, pandas...): too heavy for the test extra,
# hence a venv of its own. pip takes torch's CPU build from a local wheel where the machine has
# one (PIP_FIND_LINKS, as on this project's CI machines); elsewhere PyPI's torch of that version
# is a CUDA build of several GB, which works on a CPU too. Both are pinned so the resolver never
# swaps them for others.
VERSION=0.8.1
TORCH=2.13.0
PYTHON=${PYTHON:-python3}

default_cache=/var/cache/dgxmm
if [[ -z ${DGXMM_CACHE_DIR:-} ]] && ! { mkdir -p "$default_cache" 2>/dev/null && [[ -w $default_cache ]]; }; then
    default_cache=${XDG_CACHE_HOME:-$HOME/.cache}/dgxmm
fi
CACHE=${DGXMM_CACHE_DIR:-$default_cache}
DEST_DIR=$CACHE/guidellm-$VERSION

log() { printf 'install-guidellm [%4ds]: %s\n' "$((SECONDS - start))" "$*" >&2; }
start=$SECONDS

mkdir -p "$DEST_DIR"
DEST_DIR=$(cd "$DEST_DIR" && pwd -P)   # absolute, so the printed path is too
VENV=$DEST_DIR/venv
PY=$VENV/bin/python
STAMP=$DEST_DIR/.installed
LOG=$DEST_DIR/install.log
usable() { [[ -f $STAMP && -x $VENV/bin/guidellm ]] && "$PY" -c 'import guidellm' >/dev/null 2>&1; }

if usable; then echo "$PY"; exit 0; fi

# Parallel jobs sharing a cache must not install twice; re-check after the wait.
exec 9>"$DEST_DIR/.lock"
flock 9
if usable; then echo "$PY"; exit 0; fi

# A venv is not relocatable (its scripts name their own path), so it is built in place; the stamp
# written last marks it complete, and anything without the stamp is a leftover to start over from.
rm -rf "$VENV" "$STAMP"
: >"$LOG"
log "installing guidellm $VERSION into $VENV (about 1.5 GB with a CPU torch; full log: $LOG)"
"$PYTHON" -m venv "$VENV" >>"$LOG" 2>&1
"$PY" -m pip install --quiet --upgrade pip >>"$LOG" 2>&1
log "installing torch $TORCH, then guidellm $VERSION and its dependencies"
"$PY" -m pip install --progress-bar off "torch==$TORCH" >>"$LOG" 2>&1 \
    || { log "pip failed; see $LOG"; tail -n 30 "$LOG" >&2; exit 1; }
"$PY" -m pip install --progress-bar off "torch==$TORCH" "guidellm==$VERSION" >>"$LOG" 2>&1 \
    || { log "pip failed; see $LOG"; tail -n 30 "$LOG" >&2; exit 1; }
"$VENV/bin/guidellm" --version >>"$LOG" 2>&1 || { log "guidellm does not run; see $LOG"; exit 1; }
touch "$STAMP"
log "done ($(du -sm "$VENV" | cut -f1) MB)"
echo "$PY"
