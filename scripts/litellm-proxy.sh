#!/usr/bin/env bash
# Start or stop the real LiteLLM proxy (with its PostgreSQL) the LiteLLM tests talk to, using
# ../shared/tools/litellm. Prepared once into a cache folder; one proxy per test run.
#   scripts/litellm-proxy.sh start   -> prints "URL KEY" on its last line
#   scripts/litellm-proxy.sh stop
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
tools=${DGXMM_LITELLM_TOOLS:-$here/../shared/tools/litellm}
export ROOT=${DGXMM_LITELLM_ROOT:-/var/cache/dgxmm/litellm}
port=${DGXMM_LITELLM_PORT:-4000}
# Entries are encrypted with the master key: one ROOT always uses the same key (tools README).
key=sk-dgxmm-test-master

case "${1:-}" in
  start)
    mkdir -p "$(dirname "$ROOT")"
    PGPORT=${DGXMM_LITELLM_PGPORT:-55433} "$tools/setup.sh" >&2
    "$tools/stop.sh" "$port" >/dev/null 2>&1 || true
    "$tools/start.sh" "$port" "$key" >&2
    echo "http://127.0.0.1:$port $key"
    ;;
  stop)
    "$tools/stop.sh" "$port" --all
    ;;
  *)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
