// The deploy wizard's model from the model store: the pulled models offered as their hf://
// names (a GGUF file for llama.cpp, a whole snapshot for vLLM), and for a repository named as
// hf://ORG/REPO its files listed from the hub, so one can be chosen before dgxmm pulls it (the
// deployment waits, planned, until its files are here; docs/models.md).

import { api } from "./api.js";
import { hubName, listFiles, sizeText } from "./hubfiles.js";

const form = document.getElementById("deploy-form");
const f = form.elements;
const pulledBox = document.getElementById("d-pulled");
const pulled = document.getElementById("d-pulled-choice");
const hubBox = document.getElementById("d-hubfiles");
const hubFile = document.getElementById("d-hubfile");
const hubFileBox = document.getElementById("d-hubfile-box");
const hubHelp = document.getElementById("d-hubfile-help");
const NAME = /^hf:\/\/([^/@]+\/[^/@]+)(?:@([^/]+))?(?:\/(.+))?$/;
let records = [];
let asked = 0;
let timer = null;

/** What the pulled models offer the engine: [hf name, label] pairs. */
function choices(engine) {
  const usable = records.filter((r) => r.status === "ready" || r.status === "downloading");
  const note = (r) => (r.status === "downloading" ? ", downloading" : "");
  if (engine === "llamacpp") {
    return usable.flatMap((r) => r.files.filter((file) => file.path.endsWith(".gguf"))
      .map((file) => [hubName(r.repo, r.revision, file.path), `${r.repo}: ${file.path} (${sizeText(file.size)}${note(r)})`]));
  }
  if (engine === "vllm" || engine === "sglang") { // the whole snapshot: a pull of every file (a partial one would pull the rest)
    return usable.filter((r) => !r.include.length)
      .map((r) => [hubName(r.repo, r.revision), `${r.repo} (the whole snapshot, ${sizeText(r.bytes_total)}${note(r)})`]);
  }
  return [];
}

function options(select, first, pairs) {
  select.replaceChildren(new Option(first, ""), ...pairs.map(([value, label]) => new Option(label, value)));
}

function setModel(value) {
  f.model.value = value;
  f.model.dispatchEvent(new Event("change", { bubbles: true })); // the estimate and checks follow
  showHubFiles();
}

/** The pulled models for the engine now (read again each time the wizard opens). */
export async function fillPulled(engine, reload = false) {
  if (reload) records = await api("models").catch(() => []);
  const pairs = choices(engine);
  options(pulled, pairs.length ? "Choose a pulled model" : "", pairs);
  pulledBox.hidden = !pairs.length;
  pulled.value = pairs.some(([value]) => value === f.model.value.trim()) ? f.model.value.trim() : "";
  showHubFiles();
}

/** The local file of an hf:// name whose model is here (for the memory estimate), else the name. */
export function localPath(model) {
  const m = NAME.exec(model);
  if (!m) return model;
  const [, repo, revision = "main", path] = m;
  const r = records.find((x) => x.status === "ready" && x.repo === repo && x.revision === revision
    && x.files.some((file) => file.path === path));
  return r ? `${r.path}/${path}` : model;
}

/** hf://ORG/REPO named without a file: its files from the hub, a GGUF to choose for llama.cpp. */
async function listRepository() {
  const m = NAME.exec(f.model.value.trim());
  const engine = f.engine.value;
  const ask = ++asked;
  const listed = [...hubFile.options].some((option) => option.value && option.value === f.model.value.trim());
  if (m && m[3] && listed && !hubBox.hidden) { // one of the files listed, chosen: the list stays
    hubFile.value = f.model.value.trim();
    return;
  }
  if (!m || m[3] || !["llamacpp", "vllm", "sglang"].includes(engine)) { // no name, or a file named already
    hubBox.hidden = true;
    return;
  }
  const [, repo, revision = "main"] = m;
  hubBox.hidden = false;
  hubFileBox.hidden = true;
  hubHelp.textContent = `Asking the hub for the files of ${repo}…`;
  try {
    const found = await listFiles(repo, revision, engine === "llamacpp" ? ["*.gguf"] : []);
    if (ask !== asked) return;
    if (engine !== "llamacpp") { // a snapshot engine (vLLM, SGLang): the whole repository
      hubHelp.textContent = `${repo}: ${found.matched} files, ${sizeText(found.bytes_matched)}, pulled before its first start`
        + `${found.bytes_here ? ` (${sizeText(found.bytes_here)} here already)` : ""}.${found.warning ? ` ${found.warning}.` : ""}`;
      return;
    }
    options(hubFile, `Choose one of its ${found.matched} GGUF files`,
      found.files.map((file) => [hubName(repo, revision, file.path), `${file.path} (${sizeText(file.size)}${file.here ? ", here already" : ""})`]));
    hubFileBox.hidden = !found.files.length;
    hubHelp.textContent = found.files.length
      ? `dgxmm pulls the file you choose when you deploy; the deployment waits, planned, until it is here.${found.warning ? ` ${found.warning}.` : ""}`
      : `${repo} has no GGUF file: llama.cpp needs one.`;
  } catch (error) {
    if (ask !== asked) return;
    hubHelp.textContent = `The hub did not list ${repo}: ${error.message}`;
  }
}

function showHubFiles() {
  clearTimeout(timer);
  timer = setTimeout(() => listRepository(), 400);
}

pulled.addEventListener("change", () => { if (pulled.value) setModel(pulled.value); });
hubFile.addEventListener("change", () => { if (hubFile.value) setModel(hubFile.value); });
f.model.addEventListener("input", showHubFiles);
