// The GraphQL that prisma-client-py sends to Prisma's query-engine binary, parsed into plain
// values. It writes a small, regular subset (prisma/_builder.py): one operation holding one field,
//   mutation { result: createOneUser(data: { name: "a" tags: ["x", "y"] }) { id name } }
// where argument values are JSON literals (strings, numbers, true, false, null), bare enum
// names, { key: value ... } objects and [a, b] lists, and a selection may nest
// (`posts(where: {...}) { id }`, `_count { _all }`). Nothing else (variables, fragments,
// directives) is ever sent, so nothing else is accepted.

const TOKEN = /\s+|,|([{}()[\]:])|("(?:[^"\\]|\\.)*")|(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)|([_A-Za-z][_0-9A-Za-z]*)/y;

function tokenize(text) {
  const tokens = [];
  TOKEN.lastIndex = 0;
  while (TOKEN.lastIndex < text.length) {
    const at = TOKEN.lastIndex;
    const m = TOKEN.exec(text);
    if (!m) throw new SyntaxError(`unexpected ${JSON.stringify(text[at])} at offset ${at}`);
    if (m[1]) tokens.push({ kind: m[1] });
    else if (m[2]) tokens.push({ kind: 'value', value: JSON.parse(m[2]) });
    else if (m[3]) tokens.push({ kind: 'value', value: Number(m[3]) });
    else if (m[4]) tokens.push({ kind: 'name', value: m[4] });
  }
  return tokens;
}

const KEYWORDS = { true: true, false: false, null: null };

class Parser {
  constructor(text) {
    this.tokens = tokenize(text);
    this.at = 0;
  }

  peek(kind) {
    const token = this.tokens[this.at];
    return token !== undefined && token.kind === kind;
  }

  take(kind) {
    const token = this.tokens[this.at++];
    if (token === undefined || token.kind !== kind) {
      throw new SyntaxError(`expected ${kind}, got ${token ? token.kind : 'the end'} (token ${this.at - 1})`);
    }
    return token;
  }

  document() {
    const operation = this.take('name').value;
    const fields = this.selection();
    if (this.at !== this.tokens.length) throw new SyntaxError('text after the operation');
    return { operation, fields };
  }

  selection() {
    this.take('{');
    const fields = [];
    while (!this.peek('}')) fields.push(this.field());
    this.take('}');
    return fields;
  }

  field() {
    let name = this.take('name').value;
    let alias = null;
    if (this.peek(':')) {
      this.take(':');
      alias = name;
      name = this.take('name').value;
    }
    const args = this.peek('(') ? this.arguments() : null;
    const selection = this.peek('{') ? this.selection() : null;
    return { alias, name, args, selection };
  }

  arguments() {
    this.take('(');
    const args = {};
    while (!this.peek(')')) {
      const key = this.take('name').value;
      this.take(':');
      args[key] = this.value();
    }
    this.take(')');
    return args;
  }

  value() {
    if (this.peek('value')) return this.take('value').value;
    if (this.peek('name')) {
      const word = this.take('name').value;
      return word in KEYWORDS ? KEYWORDS[word] : word; // an enum member travels as its name
    }
    if (this.peek('[')) {
      this.take('[');
      const items = [];
      while (!this.peek(']')) items.push(this.value());
      this.take(']');
      return items;
    }
    this.take('{');
    const object = {};
    while (!this.peek('}')) {
      const key = this.take('name').value;
      this.take(':');
      object[key] = this.value();
    }
    this.take('}');
    return object;
  }
}

/** Parse one prisma-client-py query document: { operation, fields: [{ alias, name, args, selection }] }. */
export function parse(text) {
  return new Parser(text).document();
}
