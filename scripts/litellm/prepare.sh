#!/usr/bin/env bash
# Prepare ROOT, once, for a real LiteLLM proxy with its PostgreSQL database (for dgxmm's LiteLLM
# tests; scripts/litellm-proxy.sh calls this). About 4 min and 800 MB the first time.
#   scripts/litellm/prepare.sh ROOT PGPORT
#
# LiteLLM keeps its models in PostgreSQL through prisma-client-py, whose native query engine
# comes from binaries.prisma.sh, which machines with only PyPI, npm and Debian cannot reach. So:
# - LiteLLM (pinned below) and prisma-client-py come from PyPI into ROOT/venv;
# - Prisma's query-engine binary is replaced by scripts/litellm/query-engine, a Node program that
#   runs Prisma's own WebAssembly build of the same engine over the `pg` driver (npm, pinned by
#   its package-lock.json);
# - the schema is created from LiteLLM's own migration SQL (litellm-proxy-extras) with psql, so
#   Prisma's schema engine is never needed;
# - PostgreSQL is Debian's, installed with apt-get only when missing (root only), running as a
#   private cluster in ROOT/pgdata on 127.0.0.1:PGPORT.
set -euo pipefail

LITELLM_VERSION=1.108.7     # its behaviour through this setup is what tests/litellm checks
PRISMA_PY_VERSION=0.15.0    # pairs with Prisma 5.17.0 (engine commit 393aa359) in the package-lock
DB=litellm

ROOT=${1:?usage: prepare.sh ROOT PGPORT}
PGPORT=${2:?usage: prepare.sh ROOT PGPORT}
HERE=$(cd "$(dirname "$0")" && pwd)
STAMP="litellm=$LITELLM_VERSION prisma=$PRISMA_PY_VERSION pgport=$PGPORT"
start=$SECONDS
log() { printf 'litellm prepare [%4ds]: %s\n' "$((SECONDS - start))" "$*" >&2; }

mkdir -p "$ROOT"
ROOT=$(cd "$ROOT" && pwd -P)
exec 8>"$ROOT/.prepare.lock"
flock 8   # two runs sharing ROOT prepare it once
if [[ -f $ROOT/.ready ]]; then
    [[ $(cat "$ROOT/.ready") == "$STAMP" ]] && exit 0
    log "$ROOT was prepared for '$(cat "$ROOT/.ready")', not '$STAMP': remove it (rm -rf $ROOT) to prepare it again"
    exit 1
fi
if [[ -e $ROOT/pgdata ]]; then
    log "$ROOT holds an unfinished preparation: remove it (rm -rf $ROOT) and run again"
    exit 1
fi

# PostgreSQL runs as the user `postgres` when we are root (it refuses to run as root), else as us.
as_pg() { if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }
pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
if [[ -z $(pg_bin) ]]; then
    [[ $(id -u) == 0 ]] || { log "PostgreSQL is needed: apt-get install postgresql (as root)"; exit 1; }
    log "installing PostgreSQL (apt-get install postgresql)"
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2
fi
PG=$(pg_bin)
command -v node >/dev/null && command -v npm >/dev/null \
    || { log "Node.js and npm are needed: apt-get install nodejs npm"; exit 1; }

log "installing LiteLLM $LITELLM_VERSION and prisma-client-py $PRISMA_PY_VERSION into $ROOT/venv"
python3 -m venv "$ROOT/venv"
"$ROOT/venv/bin/python" -m pip install -q "litellm[proxy]==$LITELLM_VERSION" "prisma==$PRISMA_PY_VERSION" 2>&1 \
    | grep -v '^WARNING: Location' >&2 || true
"$ROOT/venv/bin/python" -c "import litellm_proxy_extras, prisma" \
    || { log "the Python packages did not install"; exit 1; }
SITE=$("$ROOT/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

log "installing the WebAssembly query engine (npm ci)"
mkdir -p "$ROOT/query-engine" "$ROOT/home" "$ROOT/bin"
cp "$HERE/query-engine/package.json" "$HERE/query-engine/package-lock.json" "$ROOT/query-engine/"
(cd "$ROOT/query-engine" && HOME=$ROOT/home npm ci --no-audit --no-fund --silent >&2)
# prisma-client-py runs these as Prisma's engines; the schema engine is never used (see above).
cat >"$ROOT/bin/query-engine" <<SH
#!/bin/sh
exec node "$ROOT/query-engine/main.mjs" "\$@"
SH
cat >"$ROOT/bin/schema-engine" <<'SH'
#!/bin/sh
if [ "$1" = --version ]; then echo "schema-engine-cli 393aa359c9ad4a4bb28630fb5613f9c281cde053"; exit 0; fi
echo "schema-engine: not available here (the schema comes from LiteLLM's migration SQL): $*" >&2
exit 1
SH
chmod +x "$ROOT/bin/query-engine" "$ROOT/bin/schema-engine"

log "creating the database cluster (PostgreSQL $(basename "$(dirname "$PG")"), 127.0.0.1:$PGPORT)"
mkdir -p "$ROOT/pgdata" "$ROOT/pgrun"
touch "$ROOT/pg.log"
[[ $(id -u) == 0 ]] && chown postgres:postgres "$ROOT/pgdata" "$ROOT/pgrun" "$ROOT/pg.log"
as_pg "$PG/initdb" -D "$ROOT/pgdata" -U postgres --auth=trust >/dev/null
as_pg "$PG/pg_ctl" -D "$ROOT/pgdata" -l "$ROOT/pg.log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $PGPORT -k $ROOT/pgrun" start >/dev/null
# (The migrations are written to be re-runnable: their "already exists, skipping" notices are noise.)
psql=(env PGOPTIONS="-c client_min_messages=error" "$PG/psql" -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PGPORT" -U postgres)
"${psql[@]}" -c "CREATE DATABASE $DB"
log "creating LiteLLM's schema from its migrations"
find "$SITE/litellm_proxy_extras/migrations" -name migration.sql | sort | while IFS= read -r sql; do
    "${psql[@]}" -d "$DB" -f "$sql" >/dev/null
done

cat >"$ROOT/env.sh" <<SH
# Sourced by scripts/litellm-proxy.sh before it starts LiteLLM from this ROOT.
export HOME=$ROOT/home npm_config_cache=$ROOT/home/.npm PATH=$ROOT/venv/bin:\$PATH
export PRISMA_QUERY_ENGINE_BINARY=$ROOT/bin/query-engine PRISMA_SCHEMA_ENGINE_BINARY=$ROOT/bin/schema-engine
export PRISMA_ENGINES_CHECKSUM_IGNORE_MISSING=1
export DATABASE_URL=postgresql://postgres@127.0.0.1:$PGPORT/$DB STORE_MODEL_IN_DB=True DISABLE_SCHEMA_UPDATE=true
export LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_TELEMETRY=False
export PG_BIN=$PG PGPORT=$PGPORT
SH
# shellcheck source=/dev/null
. "$ROOT/env.sh"
log "generating LiteLLM's Prisma client (the Prisma CLI comes from npm)"
prisma generate --schema "$SITE/litellm/proxy/schema.prisma" >&2
# The generated client's types module is large: compile it now, not at every start.
python -m compileall -q "$SITE/prisma" >/dev/null
echo "$STAMP" >"$ROOT/.ready"
log "prepared $ROOT"
