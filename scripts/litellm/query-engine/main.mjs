// Stands in for Prisma's query-engine *binary* under LiteLLM's prisma-client-py, whose native
// engine cannot be downloaded on machines without access to binaries.prisma.sh. prisma-client-py
// starts it as `<binary> -p PORT ...` with PRISMA_DML_PATH (the schema) and DATABASE_URL, and
// speaks HTTP to it: GET /status, POST / (one query or a batch), POST /transaction/start,
// POST /transaction/{id}/commit|rollback. This program answers those with the WebAssembly engine.
// Usage: node main.mjs -p PORT | --version. A test aid, not a production component.

import fs from 'node:fs';
import http from 'node:http';

import { connect } from './engine.mjs';
import { Translator, response } from './protocol.mjs';

// prisma-client-py 0.15 refuses an engine that reports another commit.
const ENGINE_COMMIT = '393aa359c9ad4a4bb28630fb5613f9c281cde053';
const argv = process.argv.slice(2);
const debug = process.env.DGXMM_QE_DEBUG ? (...parts) => console.error('[query-engine]', ...parts) : () => {};

if (argv.includes('--version') || argv.includes('-V')) {
  console.log(`query-engine ${ENGINE_COMMIT}`);
  process.exit(0);
}
if (argv[0] === 'cli') {
  // `<binary> cli ...` asks for engine metadata the WebAssembly engine cannot give; an empty answer
  // is enough for prisma-client-py.
  debug('cli', argv.slice(1).join(' '));
  console.log('{}');
  process.exit(0);
}

function option(names) {
  const at = argv.findIndex((arg) => names.includes(arg));
  return at >= 0 ? argv[at + 1] : undefined;
}

function databaseUrl() {
  // prisma-client-py passes a datasource override as JSON: [{"name": "client", "url": "..."}].
  const override = process.env.OVERWRITE_DATASOURCES;
  if (override) {
    const [first] = JSON.parse(override);
    if (first?.url) return first.url;
  }
  return process.env.DATABASE_URL;
}

const datamodel = fs.readFileSync(process.env.PRISMA_DML_PATH, 'utf8');
const translator = new Translator(datamodel);
const engine = await connect(datamodel, databaseUrl(), (line) => debug(line));

async function query(body, txId) {
  if (!body.batch) {
    const { request, resultName } = translator.request(body.query);
    debug('query', JSON.stringify(request));
    return response(JSON.parse(await engine.query(JSON.stringify(request), '{}', txId)), resultName);
  }
  const parts = body.batch.map((item) => translator.request(item.query));
  const batch = { batch: parts.map((part) => part.request), ...(body.transaction ? { transaction: {} } : {}) };
  const answer = JSON.parse(await engine.query(JSON.stringify(batch), '{}', txId));
  if (answer.batchResult) answer.batchResult = answer.batchResult.map((item, i) => response(item, parts[i].resultName));
  return answer;
}

async function handle(method, path, body, headers) {
  if (method === 'GET' && path === '/status') return { status: 'ok' };
  if (path === '/metrics') return { counters: [], gauges: [], histograms: [] };
  if (method === 'POST' && path === '/') return query(JSON.parse(body), headers['x-transaction-id']);
  if (method === 'POST' && path === '/transaction/start') return JSON.parse(await engine.startTransaction(body || '{}', '{}'));
  const tx = /^\/transaction\/([^/]+)\/(commit|rollback)$/.exec(path);
  if (method === 'POST' && tx) {
    const done = tx[2] === 'commit' ? engine.commitTransaction(tx[1], '{}') : engine.rollbackTransaction(tx[1], '{}');
    return JSON.parse(await done);
  }
  return null;
}

const server = http.createServer(async (req, res) => {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const body = Buffer.concat(chunks).toString('utf8');
  const path = req.url.split('?')[0];
  let status = 200;
  let answer;
  try {
    answer = await handle(req.method, path, body, req.headers);
    if (answer === null) [status, answer] = [404, { errors: [{ error: `no route ${req.method} ${path}` }] }];
  } catch (error) {
    // Reported the way the engine reports a failed query, so prisma-client-py raises it.
    console.error('[query-engine] failed:', error?.stack || error, body.slice(0, 2000));
    const message = String(error?.message || error);
    answer = { errors: [{ error: message, user_facing_error: { is_panic: false, message, meta: {}, error_code: 'P2000' } }] };
  }
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(answer));
});
server.listen(Number(option(['-p', '--port']) || 0), '127.0.0.1');
for (const signal of ['SIGINT', 'SIGTERM']) process.on(signal, () => process.exit(0));
