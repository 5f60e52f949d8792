// Form helpers shared by the dialogs, the mode switch and the removal confirmation (the deploy
// wizard is in wizard.js). Each form is checked here first; what the API still refuses is shown
// next to the field its error names, and the first invalid field gets the focus.

import { api, ApiError } from "./api.js";
import { IDLE, duration, idleRange, splitDuration } from "./format.js";

function errorSlot(form, name) {
  const key = String(name || "form").split(".")[0];
  return form.querySelector(`[data-error-for="${key}"]`) || form.querySelector('[data-error-for="form"]');
}

/** Show `message` next to the field `name` (or at the top of the form) and mark the input. */
export function showFieldError(form, name, message) {
  const slot = errorSlot(form, name);
  slot.textContent = message;
  const input = slot.id && form.querySelector(`[aria-describedby~="${slot.id}"]`);
  if (input && input.matches("input, select, textarea")) {
    input.setAttribute("aria-invalid", "true");
    const details = input.closest("details");
    if (details) details.open = true; // the first invalid field must be reachable
  }
  return input;
}

export function clearErrors(form) {
  for (const slot of form.querySelectorAll("[data-error-for]")) slot.textContent = "";
  for (const input of form.querySelectorAll("[aria-invalid]")) input.removeAttribute("aria-invalid");
}

/** Client checks found problems: show them, focus the first invalid field in the form's own
 * order, and report whether there were any. */
export function reportProblems(form, problems) {
  let first = null;
  for (const [name, message] of problems) {
    const input = showFieldError(form, name, message);
    if (input && (!first || first.compareDocumentPosition(input) & Node.DOCUMENT_POSITION_PRECEDING)) first = input;
  }
  if (first) first.focus();
  return problems.length > 0;
}

// The API's field names as the forms label them, for its messages (issue 41 item 9).
const FIELD_WORDS = {
  memory_gib: "the memory", served_name: "the served name", idle_timeout_s: "the idle timeout",
  gpu_ids: "the pinned GPUs", gpus: "the GPUs", health_path: "the health path", metrics_path: "the metrics path",
  args: "the extra arguments", env: "the environment", sleep_mode: "sleep mode", aliases: "the other names",
  upstream_max_connections: "the connection limit", max_concurrent: "the requests at once",
};

/** An API message as the form's own: without the leading "field: " (the message sits at that
 * field), with the other raw field names in words and no "0.00 GiB" for a size under 0.005 GiB. */
export function humanMessage(message) {
  let text = String(message).replace(/^[a-z_]+(\.[\w.]+)?: /, "");
  text = text.replace(/\b[a-z]+(_[a-z]+)+\b/g, (word) => FIELD_WORDS[word] || word);
  text = text.replace(/\b0\.00 GiB\b/g, "less than 0.01 GiB");
  return text.charAt(0).toUpperCase() + text.slice(1);
}

/** An API refusal next to its field (or at the top of the form), with the focus there. */
export function showApiError(form, error) {
  const message = error instanceof ApiError ? humanMessage(error.message) : String(error);
  const input = showFieldError(form, error.field, message);
  const target = input || errorSlot(form, "form");
  if (!target.matches("input, select, textarea, button")) target.tabIndex = -1;
  target.focus();
}

/** The idle timeout in seconds: null when empty, NaN when not a valid number. */
export function readIdle(form) {
  const raw = form.elements.idle_value.value.trim();
  if (raw === "") return null;
  const value = Number(raw);
  return Number.isFinite(value) ? value * Number(form.elements.idle_unit.value) : NaN;
}

export function checkIdle(seconds, problems) {
  if (seconds === null) return;
  if (Number.isNaN(seconds)) problems.push(["idle_timeout_s", "Enter a number."]);
  else if (seconds !== 0 && (seconds < IDLE.min || seconds > IDLE.max)) {  // 0: never stopped for idleness
    problems.push(["idle_timeout_s", `The idle timeout must be between ${idleRange("and")}.`]);
  }
}

export function setIdle(form, seconds) {
  const [value, unit] = seconds == null ? ["", 60] : splitDuration(seconds);
  form.elements.idle_value.value = value === "" ? "" : String(value);
  form.elements.idle_unit.value = String(unit);
}

/** Show the parts of a form that depend on the chosen engine or mode, or on editing. */
export function syncVisibility(form) {
  const engine = form.elements.engine ? form.elements.engine.value : "";
  const mode = form.elements.mode.value;
  const editing = form.dataset.editing === "true";
  for (const el of form.querySelectorAll("[data-when-engine]")) {
    el.hidden = !el.dataset.whenEngine.split(" ").includes(engine);
  }
  for (const el of form.querySelectorAll("[data-when-mode]")) el.hidden = el.dataset.whenMode !== mode;
  for (const el of form.querySelectorAll("[data-when-editing]")) el.hidden = !editing;
  for (const el of form.querySelectorAll("[data-not-when-editing]")) el.hidden = editing;
}

export async function submitting(form, work) {
  const button = form.querySelector('button[type="submit"]');
  const label = button.textContent;
  button.disabled = true;
  button.textContent = "Working…";
  try {
    return await work();
  } finally {
    button.disabled = false;
    button.textContent = label;
  }
}

export function wireDialog(dialog, form) {
  for (const b of dialog.querySelectorAll("[data-close]")) b.addEventListener("click", () => dialog.close());
  form.addEventListener("change", () => syncVisibility(form));
}

// --- the mode switch -------------------------------------------------------------------------

const modeDialog = document.getElementById("mode-dialog");
const modeForm = document.getElementById("mode-form");
let modeTarget = null;
let onModeSaved = () => {};
let onModeRefused = null; // (error) => whether it handled a refusal (a switch that does not fit)
wireDialog(modeDialog, modeForm);

modeForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  clearErrors(modeForm);
  const mode = modeForm.elements.mode.value;
  const problems = [];
  let idle = modeTarget.idle_timeout_s;
  if (mode === "on_demand") {
    idle = readIdle(modeForm);
    checkIdle(idle, problems);
  }
  if (reportProblems(modeForm, problems)) return;
  await submitting(modeForm, async () => {
    try {
      const view = await api(`deployments/${encodeURIComponent(modeTarget.id)}/mode`, {
        method: "PATCH", body: { mode, idle_timeout_s: idle },
      });
      modeDialog.close();
      onModeSaved(view);
    } catch (error) {
      // Memory is short for always on: the card's room offer, as a Start that does not fit has.
      if (error.code === "insufficient_memory" && onModeRefused) {
        modeDialog.close();
        onModeRefused(error, { mode, idle_timeout_s: idle });
      } else showApiError(modeForm, error);
    }
  });
});

export function openMode(view, saved, refused = null) {
  modeTarget = view;
  onModeSaved = saved;
  onModeRefused = refused;
  modeForm.reset();
  clearErrors(modeForm);
  document.getElementById("mode-title").textContent = `Mode of ${view.name}`;
  const idle = view.idle_timeout_s == null ? "the default idle timeout" : duration(view.idle_timeout_s);
  document.getElementById("mode-current").textContent = view.pending_mode === "always_on"
    ? "Now switching to always on: it becomes always on once it has started."
    : view.mode === "on_demand" ? `Now on demand, with ${idle}.` : "Now always on.";
  // It opens on the mode it has (or is switching to): Save alone changes nothing, and the idle
  // timeout of an on-demand deployment is edited here without switching it.
  modeForm.elements.mode.value = view.pending_mode || view.mode;
  setIdle(modeForm, view.idle_timeout_s);
  syncVisibility(modeForm);
  modeDialog.showModal();
  modeForm.querySelector('input[name="mode"]:checked').focus();
}

// --- confirmation ----------------------------------------------------------------------------

const confirmDialog = document.getElementById("confirm-dialog");

/** Ask before something that cannot be undone; resolves to true only when the user chose
 * `yes` (the danger button; `no` keeps things as they are and has the focus). */
export function confirmAction(title, text, yes, no = "Cancel") {
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  confirmDialog.querySelector('button[value="confirm"]').textContent = yes;
  confirmDialog.querySelector('button[value="cancel"]').textContent = no;
  confirmDialog.returnValue = "";
  confirmDialog.showModal();
  return new Promise((resolve) => {
    confirmDialog.addEventListener("close", () => resolve(confirmDialog.returnValue === "confirm"), { once: true });
  });
}

/** Stop a model that is serving: asked first, saying how many requests in flight it ends
 * (issue 41 item 12). Resolves true at once when nothing is in flight. */
export function confirmStop(view) {
  const inflight = inflightOf(view);
  if (!inflight) return Promise.resolve(true);
  const requests = inflight === 1 ? "1 request" : `${inflight} requests`;
  return confirmAction(`Stop ${view.name}?`, `It ends ${requests} in flight.`, "Stop");
}

/** Requests in flight through dgxmm (an always-on model without max_concurrent is not counted). */
export function inflightOf(view) {
  if (view.ondemand) return view.ondemand.inflight;
  return view.status && view.status.code === "serving" ? view.status.count : 0;
}

/** Ask before removing a deployment. */
export function confirmRemoval(name) {
  return confirmAction(`Remove ${name}?`,
    `The engine of “${name}” is stopped and the deployment is deleted. This cannot be undone.`, "Remove");
}
