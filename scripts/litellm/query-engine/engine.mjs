// Prisma's query engine, built as WebAssembly (@prisma/query-engine-wasm, the same engine commit
// prisma-client-py 0.15 expects), reaching PostgreSQL through the `pg` driver adapter.

import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

import { PrismaPg } from '@prisma/adapter-pg';
import { bindAdapter } from '@prisma/driver-adapter-utils';
import * as bindings from '@prisma/query-engine-wasm/postgresql/query_engine_bg.js';
import pg from 'pg';

const TEXT_OID = 25;
const { builtins } = pg.types;

// The column types @prisma/adapter-pg 5.17 converts. It refuses a result holding any other
// built-in type, and LiteLLM's raw queries read catalog columns (`name`, `regclass`) that Prisma's
// own queries never do: those are handed to the adapter as text, which is what pg parsed them to.
const CONVERTED = new Set([
  ...['INT2', 'INT4', 'INT8', 'FLOAT4', 'FLOAT8', 'BOOL', 'DATE', 'TIME', 'TIMETZ', 'TIMESTAMP',
    'TIMESTAMPTZ', 'NUMERIC', 'MONEY', 'JSON', 'JSONB', 'UUID', 'OID', 'BPCHAR', 'TEXT', 'VARCHAR',
    'BIT', 'VARBIT', 'INET', 'CIDR', 'XML', 'BYTEA'].map((name) => builtins[name]),
  // array types, by OID (pg names no array types)
  1561, 1000, 1001, 1014, 1002, 651, 1182, 1021, 1022, 1041, 1005, 1007, 1016, 3807, 199, 791,
  1231, 1028, 1009, 1115, 1183, 2951, 1563, 1015, 143,
]);
const USER_DEFINED_FROM = 10000; // enums and other user types: the adapter reads them as text

function asConvertible(result) {
  if (result.ok && Array.isArray(result.value?.fields)) {
    for (const field of result.value.fields) {
      if (field.dataTypeID < USER_DEFINED_FROM && !CONVERTED.has(field.dataTypeID)) field.dataTypeID = TEXT_OID;
    }
  }
  return result;
}

class Adapter extends PrismaPg {
  async performIO(query) {
    return asConvertible(await super.performIO(query));
  }

  async startTransaction() {
    const started = await super.startTransaction();
    if (started.ok) {
      const transaction = started.value;
      const performIO = transaction.performIO.bind(transaction);
      transaction.performIO = async (query) => asConvertible(await performIO(query));
    }
    return started;
  }
}

// Parameters Prisma reads from its connection URL that are not PostgreSQL's: pg would pass them on.
const PRISMA_URL_PARAMS = ['connection_limit', 'pool_timeout', 'connect_timeout', 'socket_timeout',
  'pgbouncer', 'statement_cache_size', 'schema', 'sslmode'];

function pgUrl(url) {
  const parsed = new URL(url);
  for (const name of PRISMA_URL_PARAMS) parsed.searchParams.delete(name);
  return parsed.toString();
}

/** A connected engine for `datamodel` (schema.prisma's text) on the database at `url`. */
export async function connect(datamodel, url, log) {
  const require = createRequire(import.meta.url);
  const dir = path.dirname(require.resolve('@prisma/query-engine-wasm/package.json'));
  const wasm = fs.readFileSync(path.join(dir, 'postgresql', 'query_engine_bg.wasm'));
  const { instance } = await WebAssembly.instantiate(wasm, { './query_engine_bg.js': bindings });
  bindings.__wbg_set_wasm(instance.exports);
  const adapter = bindAdapter(new Adapter(new pg.Pool({ connectionString: pgUrl(url), max: 10 })));
  const engine = new bindings.QueryEngine({ datamodel, logLevel: 'info', logQueries: false }, log, adapter);
  await engine.connect('{}');
  return engine;
}
