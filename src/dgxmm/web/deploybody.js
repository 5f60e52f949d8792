// The deploy wizard's form read into the body of POST (or PATCH) api/deployments and checked as
// the API checks it, every problem at once, before anything is sent. The engine's options
// (context, GPU layers, ...) are fields of their own, kept in the body's `args` as flags.

import { DEVICES, ENGINES } from "./format.js";
import { checkIdle, readIdle } from "./forms.js";

const form = document.getElementById("deploy-form");
const f = form.elements;

// Engine options shown as their own fields, kept in `args` as flags.
const OPTIONS = {
  llamacpp: [["ctx", ["-c", "--ctx-size"], "int"], ["ngl", ["-ngl", "--n-gpu-layers", "--gpu-layers"], "int"]],
  vllm: [["maxlen", ["--max-model-len"], "int"], ["gpumem", ["--gpu-memory-utilization"], "share"]],
};
// What each option allows, said with the value that is not (issue 41 item 9).
const ALLOWED = {
  ctx: "a whole number of tokens, at least 1 (0: the model's own)",
  ngl: "a whole number of layers, 0 or more (0: none on the GPU; 999: all)",
  maxlen: "a whole number of tokens, at least 1",
  gpumem: "a share of the GPU's memory above 0 and at most 1, e.g. 0.9",
};
const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
const SERVED = /^[\x21-\x7e][\x20-\x7e]{0,199}$/; // printable, as the API takes it (no leading space)
const MIN_MEMORY_GIB = 0.01; // 10 MiB: less is no model (the API takes any size above 0)

/** Split `args` into the option fields of `engine` and the rest (one per line). */
function spreadArgs(engine, args) {
  const values = {};
  const rest = [];
  for (let i = 0; i < args.length; i++) {
    const option = (OPTIONS[engine] || []).find(([, flags]) => flags.includes(args[i]));
    if (option && i + 1 < args.length) {
      values[option[0]] = args[++i];
    } else {
      rest.push(args[i]);
    }
  }
  return { values, rest };
}

/** Set the option fields from `args` of `engine` (the other engines' fields emptied): the rest
 * of `args`, for the extra arguments. */
export function fillOptions(engine, args) {
  const { values, rest } = spreadArgs(engine, args);
  for (const [name] of [...OPTIONS.llamacpp, ...OPTIONS.vllm]) f[name].value = values[name] || "";
  return rest;
}

/** A text field's lines, trimmed, the empty ones left out (one argument or variable each). */
export function lines(text) {
  return text.split("\n").map((s) => s.trim()).filter(Boolean);
}

/** The GPUs and pins the form asks for (on a host with devices). */
export function readDevices() {
  const pins = [...form.querySelectorAll('input[name="pin"]:checked')].map((box) => Number(box.value));
  return { span: Number(f.gpus.value), pins };
}

function readEnv(problems) {
  const env = {};
  lines(f.env.value).forEach((line, i) => {
    const eq = line.indexOf("=");
    if (eq <= 0) problems.push(["env", `Line ${i + 1}: write NAME=value.`]);
    else env[line.slice(0, eq).trim()] = line.slice(eq + 1);
  });
  return env;
}

export function readOptions(engine, problems) {
  const flags = [];
  for (const [name, names, kind] of OPTIONS[engine] || []) {
    const raw = f[name].value.trim();
    if (!raw) continue;
    const value = Number(raw);
    const ok = kind === "int" ? Number.isInteger(value) && value >= 0 : value > 0 && value <= 1;
    if (!ok) problems.push([name, `${raw} is not allowed here: enter ${ALLOWED[name]}.`]);
    else flags.push(names[0], raw);
  }
  return flags;
}

/** How many devices vLLM's own -tp and -pp in `args` span (null: it gives neither), as the
 * server reads them (deploy/gpus.py). */
function parallelSize(args) {
  let tp = null;
  let pp = null;
  args.forEach((arg, i) => {
    const [name, value = args[i + 1]] = arg.split("=");
    const flag = name.replace(/_/g, "-");
    if (["--tensor-parallel-size", "-tp"].includes(flag)) tp = Number(value);
    if (["--pipeline-parallel-size", "-pp"].includes(flag)) pp = Number(value);
  });
  return tp === null && pp === null ? null : (tp || 1) * (pp || 1);
}

/** `gpus` and `gpu_ids` into `b`, checked as the server checks them. */
function readGpus(b, problems, editing) {
  const { span, pins } = readDevices();
  b.gpus = span;
  const spans = b.engine === "vllm" ? parallelSize(b.args) : null;
  if (spans !== null && spans !== span) {
    problems.push(["gpus", `The extra arguments' parallel flags (-tp, -pp) span ${spans} devices: choose ${spans} here, or change them.`]);
  }
  if (pins.length && pins.length !== span) {
    problems.push(["gpu_ids", `Check ${span === 1 ? "one GPU" : `${span} GPUs`} (as many as it spans), or none.`]);
  }
  if (pins.length) b.gpu_ids = pins;
  else if (editing) b.gpu_ids = null; // unpinned
}

/** The names, checked as the API checks them (and against the other deployments' names), so
 * that every problem shows before sending. */
function checkNames(b, problems, editing, views) {
  const others = views.filter((v) => !editing || v.id !== editing.id);
  if (!b.name) problems.push(["name", "Enter a name: 1 to 64 letters, digits, “.”, “_” or “-”, starting with a letter or digit."]);
  else if (!NAME.test(b.name)) {
    problems.push(["name", `“${b.name}” is not allowed: use 1 to 64 letters, digits, “.”, “_” or “-”, starting with a letter or digit (no spaces).`]);
  } else if (others.some((v) => v.name === b.name)) {
    problems.push(["name", `Another deployment is named ${b.name}: choose another name.`]);
  }
  const served = f.served_name.value.trim();
  b.served_name = served || (editing ? null : undefined);
  if (b.served_name === undefined) delete b.served_name;
  if (served && !SERVED.test(served)) {
    problems.push(["served_name", "Use 1 to 200 printable characters (letters, digits, punctuation, spaces inside)."]);
  }
  b.aliases = f.aliases.value.split(",").map((name) => name.trim()).filter(Boolean);
  const own = served || b.name;
  const taken = (name) => others.find((v) => v.served_name === name || (v.aliases || []).includes(name));
  const wrong = [];
  for (const [i, alias] of b.aliases.entries()) {
    if (!SERVED.test(alias)) wrong.push(`“${alias}” has characters a name cannot have`);
    else if (alias === own) wrong.push(`“${alias}” is its served name already`);
    else if (b.aliases.indexOf(alias) !== i) wrong.push(`“${alias}” is given twice`);
    else if (taken(alias)) wrong.push(`“${alias}” is a name of the deployment ${taken(alias).name}`);
  }
  if (b.aliases.length > 32) wrong.push(`${b.aliases.length} names are more than the 32 allowed`);
  if (wrong.length) problems.push(["aliases", `${wrong.join("; ")}. Other names are separated by commas, each unique on this host.`]);
}

/** `max_concurrent`: a whole number from 1 to 4096, or empty for no limit (null). */
function readLimit(b, problems) {
  const given = f.max_concurrent.value.trim();
  if (given === "" && !f.max_concurrent.validity.badInput) {
    b.max_concurrent = null;
  } else if (/^[0-9]+$/.test(given) && Number(given) >= 1 && Number(given) <= 4096) {
    b.max_concurrent = Number(given);
  } else {
    const what = given ? `${given} is not allowed: ` : "";
    problems.push(["max_concurrent", `${what}enter a whole number of requests from 1 to 4096, or leave it empty for no limit.`]);
  }
}

/** The body the form asks for; what is wrong with it is pushed to `problems` as [field, message].
 * `editing`: the view being changed (null for a new one); `views`: the deployments now. */
export function readBody(problems, editing, views) {
  const engine = f.engine.value;
  const b = { name: f.name.value.trim(), engine };
  checkNames(b, problems, editing, views);
  const memory = Number(f.memory_gib.value);
  if (f.memory_gib.value.trim() === "" || !(memory >= MIN_MEMORY_GIB && memory <= 4096)) {
    const given = f.memory_gib.value.trim() === "" ? "" : `${f.memory_gib.value.trim()} GiB is not allowed: `;
    problems.push(["memory_gib", `${given}enter the memory in GiB, from ${MIN_MEMORY_GIB} to 4096.`]);
  } else {
    b.memory_gib = memory;
  }
  if (kindOf(engine).needs === "command") {
    b.command = lines(f.command.value);
    if (!b.command.length) problems.push(["command", "Enter the program to run, one argument per line."]);
    b.args = [];
  } else {
    b.model = f.model.value.trim();
    if (!b.model) problems.push(["model", "Enter the model to serve."]);
    b.args = [...readOptions(engine, problems), ...lines(f.args.value)];
  }
  if (DEVICES.length) readGpus(b, problems, editing);
  readLimit(b, problems);
  b.sleep_mode = kindOf(engine).can_sleep && f.sleep_mode.checked;
  b.health_path = f.health_path.value.trim() || null;
  b.metrics_path = f.metrics_path.value.trim() || null;
  for (const key of ["health_path", "metrics_path"]) {
    if (b[key] && !b[key].startsWith("/")) problems.push([key, "Start the path with “/”."]);
  }
  b.env = readEnv(problems);
  if (!editing) {
    b.mode = f.mode.value;
    if (b.mode === "on_demand") {
      const idle = readIdle(form);
      checkIdle(idle, problems);
      if (idle !== null) b.idle_timeout_s = idle;
      b.preload = f.preload.checked;
    }
  }
  return b;
}

function kindOf(engine) {
  return ENGINES.find((kind) => kind.name === engine) || { needs: "model", can_sleep: false };
}
