// From the GraphQL protocol prisma-client-py speaks to the JSON protocol the WebAssembly engine
// speaks, and back. Only the request's shape and a few typed values differ:
// - the field `result: findUniqueUser(args) { a b }` becomes
//   {"modelName": "User", "action": "findUnique", "query": {"arguments": args, "selection": {"a": true, ...}}};
// - a Json column's value travels in GraphQL as a string holding JSON; the JSON protocol would take
//   a plain string as a JSON *string value*, so it is sent as {"$type": "Json", "value": ...};
// - answers name the result after the action (`findUniqueUser`) and carry typed values
//   ({"$type": "DateTime", "value": ...}); prisma-client-py reads `result` and plain values.

import { parse } from './graphql.mjs';

const ACTIONS = [
  'findUnique', 'findFirst', 'findMany', 'createOne', 'createMany', 'updateOne', 'updateMany',
  'deleteOne', 'deleteMany', 'upsertOne', 'aggregate', 'groupBy',
];
const RAW_ACTIONS = new Set(['executeRaw', 'queryRaw']);
const JSON_FILTERS = new Set(['equals', 'not', 'set']);

/** Models of a Prisma schema and the type of each of their fields: { User: { id: 'String', posts: 'Post' } }. */
export function modelFields(datamodel) {
  const models = {};
  // A model's block ends at a `}` at the start of a line: defaults such as @default("{}") hold braces.
  for (const block of datamodel.matchAll(/^model\s+(\w+)\s*\{([\s\S]*?)^\}/gm)) {
    const fields = {};
    for (const line of block[2].split('\n')) {
      const field = /^\s*(\w+)\s+(\w+)/.exec(line);
      if (field && !line.trim().startsWith('//')) fields[field[1]] = field[2];
    }
    models[block[1]] = fields;
  }
  return models;
}

export class Translator {
  constructor(datamodel) {
    this.models = modelFields(datamodel);
  }

  /** The JSON-protocol request for one GraphQL document, and the name prisma-client-py expects back. */
  request(graphql) {
    const [field] = parse(graphql).fields;
    const target = this.target(field.name);
    const args = field.args || {};
    const query = {
      arguments: target.model ? this.tagJson(args, target.model) : args,
      selection: RAW_ACTIONS.has(target.action) ? {} : selection(field.selection),
    };
    const request = { action: target.action, query };
    if (target.model) request.modelName = target.model;
    return { request, resultName: field.alias || field.name };
  }

  /** `findUniqueUserOrThrow` -> { action: 'findUniqueOrThrow', model: 'User' }. */
  target(name) {
    if (RAW_ACTIONS.has(name)) return { action: name, model: null };
    const orThrow = name.endsWith('OrThrow') ? 'OrThrow' : '';
    const bare = orThrow ? name.slice(0, -orThrow.length) : name;
    for (const action of ACTIONS) {
      const model = bare.slice(action.length);
      if (bare.startsWith(action) && model in this.models) return { action: action + orThrow, model };
    }
    throw new Error(`unknown operation ${name}`);
  }

  /** Wrap the values of Json fields of `model` (and of related models, in nested writes) as typed Json. */
  tagJson(value, model) {
    if (Array.isArray(value)) return value.map((item) => this.tagJson(item, model));
    if (value === null || typeof value !== 'object') return value;
    const fields = this.models[model];
    const out = {};
    for (const [key, item] of Object.entries(value)) {
      const type = fields[key];
      if (type === 'Json') out[key] = jsonValue(item);
      else if (type in this.models) out[key] = this.tagJson(item, type);
      else out[key] = this.tagJson(item, model); // where/data/AND/OR/... keep the model
    }
    return out;
  }
}

function jsonValue(value) {
  if (typeof value === 'string') return { $type: 'Json', value };
  if (value === null || typeof value !== 'object' || Array.isArray(value)) return value;
  // A filter on a Json field: { equals: "<json>" }, { not: ... }, or an update's { set: ... }.
  const out = {};
  for (const [op, operand] of Object.entries(value)) {
    out[op] = JSON_FILTERS.has(op) && typeof operand === 'string' ? { $type: 'Json', value: operand } : operand;
  }
  return out;
}

function selection(fields) {
  if (!fields) return { $scalars: true };
  const out = {};
  for (const field of fields) {
    if (!field.args && !field.selection) out[field.name] = true;
    else out[field.name] = { ...(field.args ? { arguments: field.args } : {}), selection: selection(field.selection) };
  }
  return out;
}

/** Typed values ({"$type": "DateTime", "value": "..."}) as the plain values the GraphQL protocol sent. */
export function plain(value) {
  if (Array.isArray(value)) return value.map(plain);
  if (value === null || typeof value !== 'object') return value;
  const keys = Object.keys(value);
  if (keys.length === 2 && '$type' in value && 'value' in value) return value.value;
  return Object.fromEntries(keys.map((key) => [key, plain(value[key])]));
}

/** One JSON-protocol answer as prisma-client-py expects it: {"data": {"result": ...}} or the errors. */
export function response(answer, resultName) {
  if (!answer.data) return answer;
  const [value] = Object.values(answer.data);
  return { data: { [resultName]: plain(value) } };
}
