// The admin API's reference, read from its own OpenAPI schema (GET api/openapi.json, which needs
// no token): each path and method with its summary, parameters and body. No script from elsewhere.

const root = document.getElementById("apidocs");

function element(tag, text, className) {
  const node = document.createElement(tag);
  if (text) node.textContent = text;
  if (className) node.className = className;
  return node;
}

function schemaName(schema) {
  if (!schema) return "";
  if (schema.$ref) return schema.$ref.split("/").pop();
  if (schema.type === "array") return `array of ${schemaName(schema.items)}`;
  return schema.type || "";
}

function operation(path, method, op) {
  const section = element("section", "", "apidocs-op");
  section.append(element("h2", `${method.toUpperCase()} ${path}`));
  if (op.summary) section.append(element("p", op.summary));
  if (op.description) section.append(element("p", op.description, "help"));
  const params = op.parameters || [];
  if (params.length) {
    const list = element("ul");
    for (const p of params) list.append(element("li", `${p.name} (${p.in}${p.required ? ", required" : ""}): ${schemaName(p.schema)}`));
    section.append(list);
  }
  const body = op.requestBody && op.requestBody.content && op.requestBody.content["application/json"];
  if (body) section.append(element("p", `Body: ${schemaName(body.schema)}`));
  return section;
}

async function load() {
  const resp = await fetch("api/openapi.json");
  if (!resp.ok) throw new Error(`the schema answered ${resp.status}`);
  const schema = await resp.json();
  for (const [path, item] of Object.entries(schema.paths)) {
    for (const [method, op] of Object.entries(item)) root.append(operation(path, method, op));
  }
}

load().catch((error) => { document.getElementById("apidocs-error").textContent = String(error.message || error); });
