// The caller keys view (#keys): every key with its models, expiry, limits and usage (today, the
// last hour, in all, the last use), read again every 5 s while shown, rows updated in place so the
// focus stays. New key: a form checked as the API checks it, every problem at once, then the
// secret shown this once with Copy; Edit changes models, expiry and limits (PATCH, only what was
// changed), and whether its chats show start-up progress; End requests ends the key's requests in flight (POST end-requests) and Revoke the key
// itself, each after asking first; both say when the database could not keep the change yet. A
// viewer token (GET api/host's role) sees the list and no control that changes it; a 403 is said
// as what it is.

import { api } from "./api.js";
import { cell } from "./activity.js";
import { clearErrors, confirmAction, humanMessage, reportProblems, showFieldError, submitting } from "./forms.js";
import { timeElement } from "./format.js";
import { usageText } from "./usage.js";
import { addView } from "./views.js";

const $ = (id) => document.getElementById(id);
const REFRESH_MS = 5000;
const NAME = /^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$/;
const FIELDS = ["models", "expires_at", "max_concurrent", "tokens_per_day", "keep_alive", "progress", "priority"];
const READ_ONLY = "Not allowed: this token may only read. Keys are made, changed and revoked with the admin token.";
const body = $("keys-rows");
const dialog = $("key-dialog");
const form = $("key-form");
const keys = new Map(); // id -> the record as last read
let admin = false; // until GET api/host says so: no control is offered that may be refused
let timer = null;
let editing = null; // the record the form edits; null for a new key
let initial = {}; // the form's inputs as it opened: an edit sends only what changed

function say(text) {
  $("keys-status").textContent = text;
}

const unix = (iso) => Date.parse(iso) / 1000;

function expiry(key) {
  if (!key.expires_at) return "Never";
  const span = document.createElement("span");
  if (key.expired) {
    span.className = "expired";
    span.append("Expired ", timeElement(unix(key.expires_at)));
  } else span.append(timeElement(unix(key.expires_at)));
  return span;
}

function limits(key) {
  const parts = [];
  if (key.max_concurrent != null) parts.push(`${key.max_concurrent} at once (${key.in_flight} in flight)`);
  if (key.tokens_per_day != null) parts.push(`${key.tokens_per_day.toLocaleString("en")} tokens a day`);
  if (key.priority) parts.push(`priority ${key.priority}`);
  if (key.keep_alive === false) parts.push("may not set keep_alive");
  const limited = parts.join(", ") || "None";
  return key.progress === "reasoning" ? `${limited}; start-up progress in chat UIs` : limited;
}

function code(text) {
  const el = document.createElement("code");
  el.textContent = text;
  return el;
}

function actions(key) {
  const box = document.createElement("div");
  box.className = "key-actions";
  for (const [action, label] of [["edit", "Edit"], ["end", "End requests"], ["revoke", "Revoke"]]) {
    const button = document.createElement("button");
    button.type = "button";
    button.dataset.action = action;
    button.textContent = label;
    button.setAttribute("aria-label", `${label} ${key.name}`);
    if (action === "revoke") button.className = "danger";
    box.append(button);
  }
  return cell("Actions", box);
}

/** The key's row, made or brought up to date in place (its buttons, and so the focus, kept). */
function upsert(key) {
  keys.set(key.id, key);
  let tr = body.querySelector(`tr[data-id="${CSS.escape(key.id)}"]`);
  if (!tr) {
    tr = document.createElement("tr");
    tr.dataset.id = key.id;
    tr.append(...Array.from({ length: 9 }, () => document.createElement("td")), actions(key));
    body.append(tr);
  }
  const usage = key.usage;
  const cells = [
    ["Name", key.name], ["Prefix", code(`${key.prefix}…`)],
    ["Models", key.models == null ? "Every model" : key.models.join(", ") || "None"],
    ["Expires", expiry(key)], ["Limits", limits(key)], ["Today", usageText(usage.today)],
    ["Last hour", usageText(usage.last_hour)], ["In all", usageText(usage.total)],
    ["Last use", usage.last_used_at ? timeElement(unix(usage.last_used_at)) : "Never"],
  ];
  cells.forEach(([label, content], i) => {
    const td = tr.cells[i];
    td.dataset.label = label;
    if (content instanceof Node) td.replaceChildren(content);
    else td.textContent = content;
  });
  tr.cells[9].hidden = !admin;
  $("keys-empty").hidden = true;
}

function forget(id) {
  keys.delete(id);
  const tr = body.querySelector(`tr[data-id="${CSS.escape(id)}"]`);
  if (tr) tr.remove();
  $("keys-empty").hidden = keys.size > 0;
}

async function load() {
  const list = await api("keys");
  const ids = new Set(list.map((key) => key.id));
  for (const id of [...keys.keys()]) if (!ids.has(id)) forget(id);
  for (const key of list) upsert(key);
  $("keys-empty").hidden = list.length > 0;
}

function showRole(role) {
  admin = role !== "viewer";
  $("key-new").hidden = !admin;
  $("keys-readonly").hidden = admin;
  for (const el of document.querySelectorAll("#keys-view [data-admin-only], #keys-rows td:last-child")) el.hidden = !admin;
}

function errorText(error, key) {
  if (error.status === 403) return READ_ONLY;
  if (error.status === 404 && key) return `${key.name} no longer exists.`;
  return error.message;
}

// --- the form: a new key, or an existing one's models, expiry and limits ---------------------

/** Why `glob` is no model glob (the API's rule), or null. */
function globProblem(glob) {
  if (glob.length > 200) return `“${glob.slice(0, 40)}…” is longer than 200 characters.`;
  if (/[\s\p{C}]/u.test(glob)) return `“${glob}” has a space or an unprintable character: separate names with commas.`;
  if (/\[[^\]]*$/.test(glob)) return `“${glob}” has a “[” without its “]”.`;
  return null;
}

function localInput(iso) {
  const d = new Date(iso);
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

// The progress tick as the API's value ("reasoning" or "off"); another checkbox as true or false;
// every other field as typed.
const valueOf = (el) => {
  if (el.type !== "checkbox") return el.value.trim();
  if (el.name === "progress") return el.checked ? "reasoning" : "off";
  return el.checked;
};
const raw = () => Object.fromEntries(FIELDS.map((name) => [name, valueOf(form.elements[name])]));

/** The body to send and the problems found, each [field, message], all of them. */
function read() {
  const f = form.elements;
  const problems = [];
  const values = {};
  if (!editing) {
    const name = f.name.value.trim();
    if (!name) problems.push(["name", "Enter a name."]);
    else if (!NAME.test(name)) {
      problems.push(["name", `“${name}” is not allowed: use 1 to 64 letters, digits, “.”, “_”, “@” or “-”, starting with a letter or a digit.`]);
    } else if (name === "key-file") problems.push(["name", "“key-file” names the on-demand key file: choose another name."]);
    else if ([...keys.values()].some((key) => key.name === name)) problems.push(["name", `A key called ${name} exists: choose another name.`]);
    values.name = name;
  }
  const now = raw();
  const changed = (name) => !editing || now[name] !== initial[name];
  if (changed("models")) {
    const globs = now.models.split(",").map((glob) => glob.trim()).filter(Boolean);
    const problem = globs.length > 100 ? "At most 100 names or globs." : globs.map(globProblem).find(Boolean);
    if (problem) problems.push(["models", problem]);
    values.models = globs.length ? globs : null;
  }
  if (changed("expires_at")) {
    const when = now.expires_at ? new Date(now.expires_at) : null;
    if (f.expires_at.validity.badInput || (when && Number.isNaN(when.getTime()))) {
      problems.push(["expires_at", "Enter a date and a time, or leave it empty for never."]);
    } else if (when && when <= new Date()) {
      problems.push(["expires_at", `${when.toLocaleString()} is past: choose a later time, or leave it empty for never.`]);
    } else values.expires_at = when ? when.toISOString() : null;
  }
  for (const [name, what] of [["max_concurrent", "requests"], ["tokens_per_day", "tokens"]]) {
    if (!changed(name)) continue;
    const number = Number(now[name]);
    if (f[name].validity.badInput || (now[name] && (!Number.isInteger(number) || number < 1))) {
      problems.push([name, `${now[name] || "This"} is not allowed: enter a whole number of ${what}, 1 or more, or leave it empty for no limit.`]);
    } else values[name] = now[name] ? number : null;
  }
  if (changed("keep_alive")) values.keep_alive = now.keep_alive;
  if (changed("progress")) values.progress = now.progress;
  if (changed("priority")) {
    const number = Number(now.priority || 0);
    if (f.priority.validity.badInput || !Number.isInteger(number) || Math.abs(number) > 1000) {
      problems.push(["priority", `${now.priority} is not allowed: enter a whole number from -1000 to 1000, or leave it empty for 0.`]);
    } else values.priority = number;
  }
  return [values, problems];
}

function openForm(key = null) {
  editing = key;
  form.reset();
  clearErrors(form);
  for (const el of form.querySelectorAll("[data-not-when-editing]")) el.hidden = Boolean(key);
  $("key-dialog-title").textContent = key ? `Models and limits of ${key.name}` : "New caller key";
  form.querySelector('button[type="submit"]').textContent = key ? "Save" : "Create key";
  if (key) {
    const f = form.elements;
    f.models.value = (key.models || []).join(", ");
    f.expires_at.value = key.expires_at ? localInput(key.expires_at) : "";
    f.max_concurrent.value = key.max_concurrent ?? "";
    f.tokens_per_day.value = key.tokens_per_day ?? "";
    f.keep_alive.checked = key.keep_alive !== false;
    f.progress.checked = key.progress === "reasoning";
    f.priority.value = key.priority ? String(key.priority) : "";
  }
  initial = raw();
  dialog.showModal();
  (key ? form.elements.models : form.elements.name).focus();
}

/** The API's refusal at the fields it names, every one of them (a 422 lists them all). */
function showApiErrors(error) {
  if (error.status === 403) {
    showFieldError(form, "form", READ_ONLY);
  } else {
    const errors = error.errors && error.errors.length ? error.errors : [{ field: error.field, message: error.message }];
    reportProblems(form, errors.map((e) => [e.field, humanMessage(e.message)]));
  }
  if (!form.contains(document.activeElement) || document.activeElement === form.querySelector('button[type="submit"]')) {
    const top = form.querySelector('[data-error-for="form"]');
    if (top.textContent) {
      top.tabIndex = -1;
      top.focus();
    }
  }
}

function showSecret(name, secret) {
  $("key-secret-title").textContent = `The secret of ${name}`;
  $("key-secret-value").value = secret;
  $("key-secret").hidden = false;
  $("key-secret").focus();
  say(`${name} created. Copy its secret now: it will not be shown again.`);
}

function hideSecret() {
  $("key-secret-value").value = "";
  $("key-secret").hidden = true;
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  clearErrors(form);
  const [values, problems] = read();
  if (reportProblems(form, problems)) return;
  await submitting(form, async () => {
    try {
      if (editing && !Object.keys(values).length) {
        dialog.close();
        say(`${editing.name}: nothing changed.`);
      } else if (editing) {
        const { persisted, message, ...record } = await api(`keys/${encodeURIComponent(editing.id)}`,
          { method: "PATCH", body: values });
        dialog.close();
        upsert(record);
        say(persisted ? `${record.name}: saved.` : `${record.name}: in force, not saved yet: ${message}`);
      } else {
        const { key: secret, ...record } = await api("keys", { method: "POST", body: values });
        dialog.close();
        upsert(record);
        showSecret(record.name, secret);
      }
    } catch (error) {
      showApiErrors(error);
    }
  });
});

for (const b of dialog.querySelectorAll("[data-close]")) b.addEventListener("click", () => dialog.close());

// --- the buttons -----------------------------------------------------------------------------

async function revoke(key, button) {
  const sure = await confirmAction(`Revoke ${key.name}?`,
    `Requests with the key “${key.name}” (${key.prefix}…) are refused (401) from now on; those in flight end now. `
    + "Its usage goes with it. This cannot be undone.", "Revoke");
  if (!sure) {
    button.focus();
    return;
  }
  try {
    const kept = await api(`keys/${encodeURIComponent(key.id)}`, { method: "DELETE" });
    forget(key.id);
    say(`${key.name} revoked: requests with it are refused from now on.`
      + (kept && kept.persisted === false ? ` Not saved yet: ${kept.message}` : ""));
  } catch (error) {
    if (error.status === 404) forget(key.id);
    $("keys-error").textContent = errorText(error, key);
  }
  $("key-new").focus();
}

async function endRequests(key, button) {
  const sure = await confirmAction(`End the requests of ${key.name}?`,
    `The requests in flight with the key “${key.name}” end now: their callers get an error (503). `
    + "The key stays as it is.", "End requests");
  if (sure) {
    try {
      const { ended } = await api(`keys/${encodeURIComponent(key.id)}/end-requests`, { method: "POST" });
      say(`${key.name}: ended ${ended} ${ended === 1 ? "request" : "requests"} in flight.`);
    } catch (error) {
      if (error.status === 404) forget(key.id);
      $("keys-error").textContent = errorText(error, key);
    }
  }
  if (button.isConnected) button.focus();
}

body.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-action]");
  const key = button && keys.get(button.closest("tr").dataset.id);
  if (!key) return;
  $("keys-error").textContent = "";
  if (button.dataset.action === "edit") openForm(key);
  else if (button.dataset.action === "end") endRequests(key, button);
  else revoke(key, button);
});

$("key-new").addEventListener("click", () => {
  $("keys-error").textContent = "";
  openForm();
});

$("key-secret-copy").addEventListener("click", async () => {
  const input = $("key-secret-value");
  try {
    await navigator.clipboard.writeText(input.value);
    say("Copied the secret.");
  } catch {
    input.select();
    say("Could not copy: the secret is selected, copy it by hand.");
  }
});

$("key-secret-done").addEventListener("click", () => {
  hideSecret();
  say("");
  $("key-new").focus();
});

addView("keys", {
  title: "Caller keys",
  open() {
    api("host").then((host) => showRole(host.role)).catch(() => {});
    load().catch((error) => { $("keys-error").textContent = errorText(error); });
    clearInterval(timer);
    timer = setInterval(() => {
      if (!dialog.open) load().catch(() => {}); // not under an open form: what it checks stays put
    }, REFRESH_MS);
  },
  close() {
    clearInterval(timer);
    hideSecret(); // shown once: not again after leaving the view
    if (dialog.open) dialog.close();
    say("");
    $("keys-error").textContent = "";
  },
});
