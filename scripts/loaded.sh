#!/usr/bin/env bash
# Run a command on a busy machine: LOOPS busy loops (default 3, more than a 2-core machine has
# cores) at nice 0 for as long as it runs, the command itself at nice 10, below them, as a test
# run beside a compile or on a laptop on battery gets the CPU last (make test-loaded, .ci/run).
#   scripts/loaded.sh COMMAND...    -> the command's exit status
# Env: LOOPS (3), LOADED_MAX_S (3600: each loop ends by itself after that long, so not even a
# SIGKILL of this script leaves one spinning). The loops are stopped when the command ends, fails
# or is interrupted (Ctrl-C, SIGTERM).
set -euo pipefail
loops=${LOOPS:-3}
max_s=${LOADED_MAX_S:-3600}
pids=()
stop() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop EXIT
for _ in $(seq "$loops"); do
    timeout "$max_s" sh -c 'while :; do :; done' &
    pids+=($!)
done
echo "loaded.sh: $loops busy loops at nice 0 (pids ${pids[*]}), the command at nice 10" >&2
# In the background, so that a signal to this script is handled at once (bash runs a trap only
# after its foreground command ends); passed on as SIGTERM (a background command ignores SIGINT).
nice -n 10 "$@" &
cmd=$!
trap 'kill -TERM "$cmd" 2>/dev/null; wait "$cmd"; exit 130' INT
trap 'kill -TERM "$cmd" 2>/dev/null; wait "$cmd"; exit 143' TERM
status=0
wait "$cmd" || status=$?
exit "$status"
