// The deploy wizard, also used to edit a stopped deployment (PATCH) and to duplicate one. The
// engine's kind decides which fields apply (the form is read and checked in deploybody.js); the
// memory field says what fits right now.

import { api } from "./api.js";
import { fillOptions, lines, readBody, readDevices, readOptions } from "./deploybody.js";
import { deviceFit, deviceRooms, shareText, spanOf } from "./devices.js";
import { DEVICES, ENGINES, gib } from "./format.js";
import {
  clearErrors, reportProblems, setIdle, showApiError, showFieldError, submitting, syncVisibility, wireDialog,
} from "./forms.js";
import { fillPulled, localPath } from "./modelpick.js";

const dialog = document.getElementById("deploy-dialog");
const form = document.getElementById("deploy-form");
const f = form.elements;
let host = null;
let views = []; // the deployments now: what always-on ones hold on each device
let editing = null; // the view being edited, or null
let onDone = () => {};
let confirmedTooBig = null; // the memory the user chose to deploy although it can never fit
wireDialog(dialog, form);

/** What llama-server will hold for the model the form names (POST api/estimate), proposed as the
 * memory: asked again when the model, the context or the extra arguments change. */
const estimateHint = document.getElementById("d-memory-estimate");
let estimated = null;
let asked = 0;

async function showEstimate() {
  const model = localPath(f.model.value.trim()); // a pulled hf:// GGUF: its file here
  const ask = ++asked;
  estimated = null;
  estimateHint.hidden = true;
  if (f.engine.value !== "llamacpp" || !model.endsWith(".gguf")) return;
  const problems = [];
  const args = [...readOptions("llamacpp", problems), ...lines(f.args.value)];
  try {
    const found = await api("estimate", { method: "POST", body: { model, args } });
    if (ask !== asked) return; // a newer question was asked meanwhile
    estimated = found.suggested_memory_gib;
    estimateHint.querySelector("span").textContent = `llama-server will hold about ${gib(found.total_gib)}: `
      + `weights ${gib(found.weights_gib)}, KV cache ${gib(found.kv_cache_gib)} for a context of ${found.context}`
      + ` tokens. Proposed: ${gib(estimated)}.`;
    estimateHint.querySelector("button").textContent = `Use ${gib(estimated)}`;
    estimateHint.hidden = false;
  } catch {
    // not a file this host can read (a path inside a container): no proposal
  }
}

estimateHint.querySelector("button").addEventListener("click", () => {
  if (estimated === null) return;
  f.memory_gib.value = String(estimated);
  showFit();
  f.memory_gib.focus();
});

/** Whether the memory fits on the devices the form asks for: {verdict, share, ...} (devices.js). */
function fitOnDevices(want) {
  const { span, pins } = readDevices();
  return deviceFit(deviceRooms(host, views), want, Math.max(span, 1), pins, f.mode.value === "on_demand");
}

/** The memory hint on a host with devices: what each device has free, and whether it fits. */
function deviceHint(hint, want) {
  const rooms = deviceRooms(host, views);
  const { span, pins } = readDevices();
  let verdict = "";
  if (pins.length && pins.length !== span) {
    verdict = ` Check ${span === 1 ? "one GPU" : `${span} GPUs`} to pin it, or none.`;
  } else if (f.memory_gib.value.trim() !== "" && want > 0 && span > 0) {
    const fit = fitOnDevices(want);
    const needs = span === 1 ? `It needs ${gib(fit.share)} on one device` : `It needs ${gib(fit.share)} on each of ${span} devices`;
    if (fit.verdict === "now") verdict = ` ${needs}: it fits now.`;
    else if (fit.verdict === "wait") verdict = ` ${needs}: it does not fit now; its requests wait until idle models make room.`;
    else if (f.mode.value === "on_demand") {
      verdict = ` ⚠ It can never fit: it ${shareText(fit, span)}, so every request for it would be refused (does_not_fit).`;
      hint.classList.add("warning");
    } else verdict = ` It does not fit: it ${shareText(fit, span)}; an always-on model must fit to start.`;
  }
  hint.textContent = `Free now: ${rooms.map((r) => `GPU ${r.index} ${gib(r.free)} of ${gib(r.usable)}`).join(", ")}.${verdict}`;
}

/** The memory hint: what is free now, what on-demand models can ever get, and whether it fits. */
function showFit() {
  const hint = document.getElementById("d-memory-fit");
  if (!host) {
    hint.textContent = "";
    return;
  }
  const m = host.memory;
  const want = Number(f.memory_gib.value);
  const onDemand = f.mode.value === "on_demand";
  let verdict = "";
  hint.classList.remove("warning");
  if (DEVICES.length) {
    deviceHint(hint, want);
    return;
  }
  if (f.memory_gib.value.trim() !== "" && want > 0) {
    if (want <= m.free_gib) verdict = " It fits now.";
    else if (onDemand && want <= m.capacity_gib) verdict = ` It does not fit now (${gib(want - m.free_gib)} short): its requests wait until idle models make room.`;
    else if (onDemand) {
      verdict = ` ⚠ It can never fit: on-demand models can get at most ${gib(m.capacity_gib)} here, so every `
        + "request for it would be refused (does_not_fit).";
      hint.classList.add("warning");
    }
    else verdict = ` It does not fit now (${gib(want - m.free_gib)} short): an always-on model must fit to start.`;
  }
  hint.textContent = `Free now: ${gib(m.free_gib)} of ${gib(m.usable_gib)} usable; on-demand models can get up to ${gib(m.capacity_gib)}.${verdict}`;
}

form.addEventListener("input", (event) => {
  if (event.target === f.memory_gib) showFit();
});
// Each field that was changed is checked as the focus leaves it (its own message only: what the
// submit or the API said elsewhere stays), so problems show before Deploy is pressed. Only when it
// was changed since its last check or the submit: leaving a field untouched keeps the submit's
// message, so the form does not move under the next click (a pin checked after a refusal).
const touched = new Set();
const fieldOf = (input) => (input.name === "pin" ? "gpu_ids" : input.name === "idle_value" ? "idle_timeout_s" : input.name);
function checkField(name) {
  if (!touched.delete(name)) return;
  const problems = [];
  readBody(problems, editing, views);
  const slot = form.querySelector(`[data-error-for="${name}"]`);
  if (!slot) return;
  slot.textContent = "";
  const input = slot.id && form.querySelector(`[aria-describedby~="${slot.id}"]`);
  if (input) input.removeAttribute("aria-invalid");
  for (const [field, message] of problems) if (field === name) showFieldError(form, name, message);
}
// Checked as the focus leaves a field, unless it goes to Deploy: the submit reports every problem
// itself, and a message appearing under the field then would move the button from under the click.
form.addEventListener("focusout", (event) => {
  if (!event.target.matches("input, select, textarea")) return;
  if (!(event.relatedTarget && event.relatedTarget.type === "submit")) checkField(fieldOf(event.target));
});
form.addEventListener("change", (event) => {
  const name = fieldOf(event.target);
  if (name && name !== "engine" && name !== "mode") touched.add(name);
  showFit();
  if ([f.model, f.engine, f.ctx, f.args].includes(event.target)) showEstimate();
  if (event.target === f.engine) fillPulled(f.engine.value);
});

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  clearErrors(form);
  touched.clear();
  const problems = [];
  const b = readBody(problems, editing, views);
  // On a host with devices, once the GPUs and pins make sense: too big for the devices it may use.
  const placeable = b.memory_gib && b.gpus > 0 && (!b.gpu_ids || b.gpu_ids.length === b.gpus);
  const onDevices = DEVICES.length && placeable ? fitOnDevices(b.memory_gib) : null;
  const hopeless = !editing && host && b.mode === "on_demand"
    && (DEVICES.length ? onDevices && onDevices.verdict === "never" : b.memory_gib > host.memory.capacity_gib);
  const tried = `${b.memory_gib}/${b.gpus}/${b.gpu_ids}`;
  if (hopeless && confirmedTooBig !== tried) {
    confirmedTooBig = tried; // pressed again with the same memory and devices: deployed all the same
    const why = onDevices ? `it ${shareText(onDevices, b.gpus)}`
      : `on-demand models can get at most ${gib(host.memory.capacity_gib)}`;
    problems.push(["memory_gib", `${gib(b.memory_gib)} can never fit here (${why}): its requests would be refused. `
      + "Lower it, or press Deploy again to deploy it anyway."]);
  }
  if (reportProblems(form, problems)) return;
  await submitting(form, async () => {
    try {
      const view = editing
        ? await api(`deployments/${encodeURIComponent(editing.id)}`, { method: "PATCH", body: b })
        : await api("deployments", { method: "POST", body: b });
      dialog.close();
      onDone(view);
    } catch (error) {
      showApiError(form, error);
    }
  });
});

function fill(view) {
  f.name.value = view.name;
  f.engine.value = view.engine;
  f.model.value = view.model || "";
  f.command.value = (view.command || []).join("\n");
  f.args.value = fillOptions(view.engine, view.args || []).join("\n");
  f.served_name.value = view.served_name === view.name ? "" : view.served_name;
  f.aliases.value = (view.aliases || []).join(", ");
  f.memory_gib.value = String(view.memory_gib);
  if (DEVICES.length) fillGpus(spanOf(view), view.gpu_pins || []);
  f.mode.value = view.mode;
  setIdle(form, view.idle_timeout_s);
  f.preload.checked = Boolean(view.preload);
  f.max_concurrent.value = view.max_concurrent == null ? "" : String(view.max_concurrent);
  f.sleep_mode.checked = Boolean(view.sleep_mode);
  f.health_path.value = view.health_path || "";
  f.metrics_path.value = view.metrics_path || "";
  f.env.value = Object.entries(view.env || {}).map(([k, v]) => `${k}=${v}`).join("\n");
  document.getElementById("d-advanced").open = Boolean(view.sleep_mode || view.health_path
    || view.metrics_path || Object.keys(view.env || {}).length);
}

/** The engine kinds the server knows, as the engine's choices (once: they do not change). */
function fillEngines() {
  if (f.engine.options.length) return;
  for (const kind of ENGINES) {
    f.engine.append(new Option(kind.summary ? `${kind.label} (${kind.summary})` : kind.label, kind.name));
  }
}

/** The GPUs choice (1 to the host's devices; 0 kept for an engine that uses none) and a pin
 * box per device, set to `span` and `pins`. */
function fillGpus(span, pins) {
  const counts = DEVICES.map((d, i) => i + 1);
  if (span === 0) counts.unshift(0);
  f.gpus.replaceChildren(...counts.map((n) => new Option(n === 0 ? "None (it uses no GPU)" : String(n), String(n))));
  f.gpus.value = String(span);
  document.getElementById("d-pins").replaceChildren(...DEVICES.map((d) => {
    const label = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.name = "pin";
    box.value = String(d.index);
    box.checked = pins.includes(d.index);
    box.setAttribute("aria-describedby", "d-pins-help d-gpu_ids-error");
    label.append(box, ` GPU ${d.index} (${gib(d.total_gib)})`);
    return label;
  }));
}

/**
 * Open the wizard. `how`: {edit: view} changes a stopped deployment, {copy: view} starts from a
 * copy of one (its names cleared: they are unique), else a new deployment (on demand proposed
 * when the model router or LiteLLM can call it). `done(view,
 * kind)` gets the answer, kind being "created" or "changed".
 */
export function openWizard(hostNow, viewsNow, how, done) {
  host = hostNow;
  views = viewsNow;
  fillEngines();
  editing = how.edit || null;
  const source = how.edit || how.copy || null;
  onDone = (view) => done(view, editing ? "changed" : "created");
  form.reset();
  clearErrors(form);
  touched.clear();
  confirmedTooBig = null;
  document.getElementById("d-devices").hidden = !DEVICES.length; // nothing of devices on a pooled host
  if (DEVICES.length) fillGpus(1, []);
  form.dataset.editing = String(Boolean(editing));
  document.getElementById("d-advanced").open = false;
  const title = document.getElementById("deploy-title");
  const submit = form.querySelector('button[type="submit"]');
  const router = Boolean(host && host.router && host.router.ready);
  const litellm = Boolean(host && host.ondemand && host.ondemand.litellm_ready);
  const ready = router || litellm;
  if (source) fill(source);
  if (how.copy) {
    f.name.value = `${how.copy.name}-copy`.slice(0, 64);
    f.served_name.value = ""; // served names and aliases are unique on a host: the copy gets its own
    f.aliases.value = "";
  }
  if (!source) f.mode.value = ready ? "on_demand" : "always_on";
  title.textContent = editing ? `Edit ${editing.name}` : how.copy ? `Duplicate ${how.copy.name}` : "Deploy a model";
  submit.textContent = editing ? "Save changes" : "Deploy";
  document.getElementById("d-mode-hint").textContent = source
    ? (how.copy ? `Copied from ${how.copy.name}.` : "")
    : ready && !router
      ? "Proposed: on demand. LiteLLM is ready, so the model stays callable while it is stopped."
      : ready
        ? `Proposed: on demand. ${litellm ? "LiteLLM is ready and the" : "The"} model router (${host.router.path}) keeps it callable by name while it is stopped.`
        : "Proposed: always on. LiteLLM is not ready and the model router has no on-demand key, so an on-demand model could not be called.";
  syncVisibility(form);
  showFit();
  fillPulled(f.engine.value, true).then(showEstimate); // (the estimate of a pulled GGUF needs its file)
  dialog.showModal();
  (how.copy ? f.name : f.engine).focus();
}

/** A newer host summary while the wizard is open: the memory hint follows it. */
export function wizardHost(hostNow, viewsNow) {
  host = hostNow;
  views = viewsNow;
  if (dialog.open) showFit();
}
