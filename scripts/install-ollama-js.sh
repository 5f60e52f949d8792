#!/usr/bin/env bash
# Install Ollama's JavaScript client (the npm package "ollama") once per version, cached outside
# the clone, for tests/integration/test_ollama_js.py. The last stdout line is the folder that holds
# its node_modules:   DIR=$(scripts/install-ollama-js.sh | tail -1)
# Env: DGXMM_CACHE_DIR (default /var/cache/dgxmm, or ~/.cache/dgxmm when that is not writable).
# Needs Node.js with npm.
set -euo pipefail
VERSION=0.6.4

default_cache=/var/cache/dgxmm
if [[ -z ${DGXMM_CACHE_DIR:-} ]] && ! { mkdir -p "$default_cache" 2>/dev/null && [[ -w $default_cache ]]; }; then
    default_cache=${XDG_CACHE_HOME:-$HOME/.cache}/dgxmm
fi
DEST=${DGXMM_CACHE_DIR:-$default_cache}/ollama-js-$VERSION
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd -P)
if [[ ! -f $DEST/node_modules/ollama/package.json ]]; then
    printf 'install-ollama-js: npm install ollama@%s into %s\n' "$VERSION" "$DEST" >&2
    (cd "$DEST" && npm install --no-audit --no-fund --silent "ollama@$VERSION" >&2)
fi
echo "$DEST"
