#!/usr/bin/env bash
# Start or stop a real LiteLLM proxy with its PostgreSQL, for the tests against real LiteLLM
# (make test-litellm, .ci/run). Prepared once into a cache folder (scripts/litellm/prepare.sh,
# about 4 min); a start takes 70-90 s on 2 cores.
#   scripts/litellm-proxy.sh start   -> prints "URL KEY" on its last line
#   scripts/litellm-proxy.sh stop    -> stops the proxy and its PostgreSQL
# Env: DGXMM_LITELLM_ROOT (default $DGXMM_CACHE_DIR/litellm; the cache dir defaults to
#      /var/cache/dgxmm, or ~/.cache/dgxmm when that is not writable), DGXMM_LITELLM_PORT (4000),
#      DGXMM_LITELLM_PGPORT (55433). Several proxies can run side by side with distinct values.
# Needs python3-venv, Node.js with npm, curl, and PostgreSQL (installed with apt-get if missing,
# as root). As root, ROOT must be readable by the `postgres` user (not under /root).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

cache=/var/cache/dgxmm
if [[ -z ${DGXMM_CACHE_DIR:-} ]] && ! { mkdir -p "$cache" 2>/dev/null && [[ -w $cache ]]; }; then
    cache=${XDG_CACHE_HOME:-$HOME/.cache}/dgxmm
fi
root=${DGXMM_LITELLM_ROOT:-${DGXMM_CACHE_DIR:-$cache}/litellm}
port=${DGXMM_LITELLM_PORT:-4000}
pgport=${DGXMM_LITELLM_PGPORT:-55433}
# LiteLLM encrypts the stored models with its master key: one ROOT always uses the same key, or
# the entries of an earlier run could not be read.
key=sk-dgxmm-test-master

as_pg() { if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
log() { printf 'litellm-proxy: %s\n' "$*" >&2; }

stop_proxy() {
    local pidfile=$root/litellm-$port.pid pid
    [[ -f $pidfile ]] || return 0
    pid=$(cat "$pidfile")
    # The proxy runs in its own session: signal the whole group (its query engine included).
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$pidfile"
}

case "${1:-}" in
start)
    "$here/litellm/prepare.sh" "$root" "$pgport"
    root=$(cd "$root" && pwd -P)
    # shellcheck source=/dev/null
    . "$root/env.sh"
    if ! as_pg "$PG_BIN/pg_ctl" -D "$root/pgdata" status >/dev/null 2>&1; then
        as_pg "$PG_BIN/pg_ctl" -D "$root/pgdata" -l "$root/pg.log" -w \
            -o "-c listen_addresses=127.0.0.1 -p $PGPORT -k $root/pgrun" start >/dev/null
    fi
    # The query engine runs from this checkout's scripts (its npm packages stay in ROOT).
    cp "$here"/litellm/query-engine/*.mjs "$root/query-engine/"
    stop_proxy
    config=$root/config-$port.yaml
    printf 'general_settings:\n  master_key: %s\n' "$key" >"$config"
    setsid "$root/venv/bin/litellm" --config "$config" --host 127.0.0.1 --port "$port" \
        >"$root/litellm-$port.log" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$root/litellm-$port.pid"
    log "starting LiteLLM on 127.0.0.1:$port (pid $pid, log $root/litellm-$port.log)"
    for _ in $(seq 300); do
        if curl -fs -m 2 "http://127.0.0.1:$port/health/liveliness" >/dev/null; then
            echo "http://127.0.0.1:$port $key"
            exit 0
        fi
        kill -0 "$pid" 2>/dev/null || { log "LiteLLM exited; see $root/litellm-$port.log"; tail -n 20 "$root/litellm-$port.log" >&2; exit 1; }
        sleep 1
    done
    log "LiteLLM did not answer within 300 s; see $root/litellm-$port.log"
    stop_proxy
    exit 1
    ;;
stop)
    stop_proxy
    if [[ -f $root/env.sh ]]; then
        # shellcheck source=/dev/null
        . "$root/env.sh"
        as_pg "$PG_BIN/pg_ctl" -D "$root/pgdata" -m fast stop >/dev/null 2>&1 || true
    fi
    ;;
*)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
