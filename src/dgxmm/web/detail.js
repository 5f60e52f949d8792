// The detail view of one deployment (#deployment/<id>): what it is and where to reach it, its
// command line, why it failed, the last hour as sparklines, its starts, the live engine log, and
// its events and audit rows. Live views from the event stream update it in place.

import { api } from "./api.js";
import { cell, change } from "./activity.js";
import { buildActions, isDeclared, lastFailure, reasonBlock, scrollToMark, updateActions } from "./cards.js";
import { bars, sparkline } from "./charts.js";
import { devicesText, spanOf } from "./devices.js";
import { DEVICES, ENGINE_LABELS, LITELLM_LABELS, clock, gib, memoryText, modeText, modelNames, timeElement } from "./format.js";
import { followLog, stopLog } from "./logtail.js";
import { resetPlayground, setDeployment } from "./playground.js";
import { setTitle } from "./problems.js";
import { clearStatus, renderStatus } from "./status.js";
import { closeWaiting, showWaiting } from "./waiting.js";
import { usageText } from "./usage.js";

const $ = (id) => document.getElementById(id);
const view = $("detail-view");
const field = (name) => view.querySelector(`[data-field="${name}"]`);
let current = null; // the deployment id shown
let shownView = null;
let host = null;
let timer = null;
let auditTimer = null;
let historyTimer = null;
let following = false; // the log, history, events and audit of `current` are loaded
let onUnauthorized = () => {};
buildActions($("detail-actions"), "detail-title");

export function detailId() {
  return current;
}

function copyButton(text, what) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = "copy";
  b.dataset.copy = text;
  b.textContent = "Copy";
  b.setAttribute("aria-label", `Copy the ${what}`);
  return b;
}

function fact(list, term, value, copy) {
  const div = document.createElement("div");
  const dt = document.createElement("dt");
  dt.textContent = term;
  const dd = document.createElement("dd");
  if (copy) {
    const code = document.createElement("code");
    code.textContent = value;
    dd.append(code, " ", copyButton(value, copy));
  } else if (value instanceof Node) {
    dd.append(value);
  } else {
    dd.textContent = value;
  }
  div.append(dt, dd);
  list.append(div);
}

function renderFacts(v) {
  const list = $("detail-facts");
  list.replaceChildren();
  const gateway = new URL(`ondemand/${v.id}/v1`, location.href).href;
  fact(list, "ID", v.id, "ID");
  if (host && host.router && host.router.enabled) {
    fact(list, "OpenAI base URL", new URL(host.router.path, location.href).href, "OpenAI base URL");
  }
  fact(list, "Model names", modelNames(v));
  fact(list, "Gateway URL", gateway, "gateway URL");
  if (host && host.litellm && host.litellm.gateway_url) {
    fact(list, "LiteLLM calls it at", `${host.litellm.gateway_url}/${v.id}/v1`, "URL LiteLLM calls");
  }
  fact(list, "LiteLLM name", v.served_name);
  const lite = v.litellm || { status: "disabled" };
  fact(list, "LiteLLM status", (LITELLM_LABELS[lite.status] || lite.status) + (lite.error ? ` (${lite.error})` : ""));
  fact(list, "Engine", ENGINE_LABELS[v.engine] || v.engine);
  if (v.model) fact(list, "Model", v.model);
  fact(list, "Memory", memoryText(v));
  const devices = devicesText(v);
  const span = spanOf(v);
  if (devices) fact(list, "GPUs", span > 1 ? `${devices} (${gib(v.memory_gib / span)} on each)` : devices);
  if (v.tokens_per_s != null) fact(list, "Generation speed", `${v.tokens_per_s} tokens/s (its latest answers)`);
  const suggested = v.memory_suggested_gib;
  if (suggested != null && Math.abs(suggested - v.memory_gib) >= 0.1) {
    const what = document.createDocumentFragment();
    const each = DEVICES.length && span > 1 ? ` (${gib(suggested / span)} on each of its ${span} GPUs)` : "";
    what.append(`${gib(suggested)}${each}: its highest measured run, plus 10 %. `);
    const use = document.createElement("button");
    use.type = "button";
    use.dataset.memory = String(suggested);
    use.textContent = `Declare ${gib(suggested)}`;
    const stopped = ["stopped", "failed", "planned"].includes(v.state);
    use.disabled = !stopped || isDeclared(v);
    what.append(use, isDeclared(v) ? " (declared in a file: set its memory_gib there)"
      : stopped ? "" : " (stop it first: the memory of a running engine is not changed)");
    fact(list, "Suggested memory", what);
  }
  fact(list, "Mode", modeText(v));
  fact(list, "Requests at once", v.max_concurrent == null ? "no limit" : `at most ${v.max_concurrent}; the others wait their turn`);
  fact(list, "Request parameters", paramsText(v));
  const can = v.capabilities || [];
  fact(list, "Capabilities", can.length ? can.join(", ") : "what the model's files show (Ollama's /api/show)");
  const since = document.createDocumentFragment();
  since.append(`${v.state} since `, timeElement(v.state_changed_at));
  fact(list, "Engine state", since);
  if (v.base_url) fact(list, "Engine address", v.base_url);
  const level = v.sleep_level === null || v.sleep_level === undefined ? "the host's default level" : `level ${v.sleep_level}`;
  fact(list, "Sleep mode", v.sleep_mode ? `yes, ${level}` : "no");
  fact(list, "Health path", v.health_path || "/health (default)");
  fact(list, "Metrics path", v.metrics_path || "/metrics (default)");
  // A viewer token is given the names alone (api/redact.py): each value null.
  const env = Object.entries(v.env || {}).map(([k, val]) => (val === null ? k : `${k}=${val}`)).join(" ");
  fact(list, "Environment", env || "nothing added");
  fact(list, "Created", timeElement(v.created_at));
  if (isDeclared(v)) fact(list, "Declared in", v.declared_in, "file that declares it");
}

/** What the gateway does to a chat, completion or responses body before the engine gets it. */
function paramsText(v) {
  const shown = (params) => Object.entries(params || {}).map(([k, val]) => `${k} = ${JSON.stringify(val)}`).join(", ");
  const parts = [];
  if (shown(v.request_overrides)) parts.push(`always ${shown(v.request_overrides)}`);
  if (shown(v.request_defaults)) parts.push(`unless the client sets them, ${shown(v.request_defaults)}`);
  if ((v.strip_params || []).length) parts.push(`removed: ${v.strip_params.join(", ")}`);
  return parts.length ? parts.join("; ") : "none: bodies reach the engine as sent";
}

/** Why it failed goes first while it is failed (the reason is what its reader came for); a past
 * failure goes back to its place after the playground. */
function placeFailure(failed) {
  const failure = $("detail-failure");
  const grid = failure.parentElement;
  const after = $("d-activity-title").parentElement; // the panel it sits before otherwise
  if (failed && grid.firstElementChild !== failure) grid.prepend(failure);
  else if (!failed && failure.nextElementSibling !== after) after.before(failure);
}

/** Show `v` (a fresh view of the deployment shown). */
export function updateDetail(v) {
  if (!current || v.id !== current) return;
  if (v.removed) {
    // Removed while shown (or never there): say so, with no badge left of what it was.
    const name = v.name || (shownView && shownView.name);
    $("detail-missing").textContent = name ? `${name} was removed.` : "This deployment no longer exists.";
    $("detail-missing").hidden = false;
    $("detail-actions").hidden = true;
    $("detail-offer").hidden = true;
    clearStatus(field("status"), field("status_detail"));
    closeWaiting();
    $("detail-waiting-panel").hidden = true;
    if (!shownView) $("detail-title").textContent = "Deployment";
    else setTitle(`${name} (removed) · dgxmm`);
    stopLog();
    return;
  }
  shownView = v;
  $("detail-missing").hidden = true;
  $("detail-actions").hidden = false;
  $("detail-title").textContent = v.name;
  setTitle(`${v.name} · dgxmm`);
  renderStatus(field("status"), field("status_detail"), v);
  updateActions($("detail-actions"), v);
  $("detail-declared").hidden = !isDeclared(v);
  $("detail-declared-file").textContent = v.declared_in || "";
  renderFacts(v);
  showWaiting(v);
  $("detail-cmdline").textContent = (v.command_line || []).map((a) => (/[\s"'$]/.test(a) ? JSON.stringify(a) : a)).join(" ");
  const reason = v.state === "failed" ? v.state_reason : lastFailure(v) && lastFailure(v).reason;
  placeFailure(v.state === "failed");
  $("detail-failure").hidden = !reason;
  $("d-failure-title").textContent = v.state === "failed" ? "Why it failed" : "Why the last start failed";
  if (reason) {
    $("detail-reason").replaceChildren(reasonBlock(reason, { earlier: true }));
    scrollToMark($("detail-reason"));
  }
  // The counts moved: the sparklines follow, a second later (once for a burst of views).
  clearTimeout(historyTimer);
  historyTimer = setTimeout(() => loadHistory().catch(() => {}), 1000);
  if (!following) {
    following = true;
    followLog(v.id, { unauthorized: onUnauthorized, name: v.name });
    reloadDetail();
    timer = setInterval(() => loadHistory().catch(() => {}), 30000);
  }
}

function minuteLabel(unix) {
  return new Date(unix * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

async function loadHistory() {
  const id = current;
  const h = await api(`deployments/${encodeURIComponent(id)}/history`);
  if (id !== current) return;
  const labels = h.minutes.map((m) => minuteLabel(m.start));
  const series = (key) => h.minutes.map((m) => m[key]);
  const done = h.starts.filter((s) => s.duration_s != null && (s.outcome === "ready" || s.outcome === "failed"));
  const counts = shownView && shownView.ondemand; // the counts now (the series holds each minute's peak)
  const usage = $("detail-usage");
  usage.replaceChildren();
  fact(usage, "Usage, last hour", usageText(h.usage.last_hour));
  fact(usage, "Usage today (UTC)", usageText(h.usage.today));
  $("detail-charts").replaceChildren(
    sparkline({ title: "Requests per minute", values: series("requests"), labels }),
    sparkline({ title: "In flight", values: series("inflight_max"), labels, current: counts ? counts.inflight : null }),
    sparkline({ title: "Queued", values: series("queued_max"), labels, current: counts ? counts.queued : null }),
    sparkline({ title: "Refused per minute", values: series("refusals"), labels }),
    bars({ title: "Cold starts and wakes", unit: " s", items: done.map((s) => ({
      label: clock(s.began_at), value: s.duration_s,
      kind: s.outcome === "failed" ? "failed" : s.kind === "wake" ? "wake" : "start" })) }),
  );
  const body = $("detail-starts");
  const outcome = { ready: "Ready", failed: "Failed", stopped: "Stopped first", loading: "Loading…" };
  body.replaceChildren(...h.starts.slice().reverse().map((s) => {
    const tr = document.createElement("tr");
    tr.append(cell("Began", timeElement(s.began_at)), cell("Kind", s.kind === "wake" ? "Wake" : "Cold start"),
      cell("Took", s.duration_s == null ? "…" : `${s.duration_s.toFixed(1)} s`), cell("Outcome", outcome[s.outcome] || s.outcome));
    return tr;
  }));
  $("detail-starts-empty").hidden = h.starts.length > 0;
}

function eventRow(row) {
  const tr = document.createElement("tr");
  tr.append(cell("Time", timeElement(row.time)), cell("Actor", row.actor), cell("Event", row.text));
  return tr;
}

async function loadEvents() {
  const id = current;
  const rows = await api(`events/history?limit=100&deployment_id=${encodeURIComponent(id)}`);
  if (id === current) $("detail-events").replaceChildren(...rows.reverse().map(eventRow));
}

async function loadAudit() {
  const id = current;
  const rows = await api(`audit?limit=100&deployment_id=${encodeURIComponent(id)}`);
  if (id !== current) return;
  $("detail-audit").replaceChildren(...rows.map((row) => {
    const tr = document.createElement("tr");
    tr.append(cell("Time", timeElement(row.time)), cell("User", row.user || row.actor), cell("Action", row.action),
      cell("Change", change(row.old, row.new)), cell("Details", row.text));
    return tr;
  }));
}

/** Everything that is not pushed live, again (on open, on reconnect). */
export function reloadDetail() {
  if (!current) return;
  loadHistory().catch(() => {});
  loadEvents().catch(() => {});
  loadAudit().catch(() => {});
}

/** A live event row: shown at once if it is about this deployment. */
export function detailEvent(row) {
  if (!current || row.deployment_id !== current) return;
  $("detail-events").prepend(eventRow(row));
  clearTimeout(auditTimer);
  auditTimer = setTimeout(() => {
    loadAudit().catch(() => {});
    loadHistory().catch(() => {});
  }, 400);
}

/** Show deployment `id`; `v` is its view if known yet (else the first live view fills it in). */
setDeployment(() => shownView);

export function openDetail(id, v, hostNow, unauthorized) {
  if (current !== id) closeDetail();
  current = id;
  host = hostNow;
  onUnauthorized = unauthorized;
  $("detail-error").textContent = "";
  $("detail-status").textContent = "";
  $("detail-offer").replaceChildren(); // (an offer made in the detail view of another deployment)
  $("detail-offer").hidden = true;
  $("detail-missing").hidden = true;
  if (v) updateDetail(v);
  else if (!shownView) $("detail-title").textContent = "Loading…";
}

export function closeDetail() {
  if (current !== null) resetPlayground();
  current = null;
  shownView = null;
  following = false;
  closeWaiting();
  clearTimeout(historyTimer);
  clearInterval(timer);
  timer = null;
  stopLog();
}

export function detailHost(hostNow) {
  host = hostNow;
  if (shownView) renderFacts(shownView);
}

async function copy(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "visually-hidden";
    document.body.append(area);
    area.select();
    const ok = document.execCommand("copy");
    area.remove();
    return ok;
  }
}

view.addEventListener("click", async (event) => {
  const declare = event.target.closest("button[data-memory]");
  if (declare && shownView) {
    const name = shownView.name;
    try {
      await api(`deployments/${encodeURIComponent(shownView.id)}`, {
        method: "PATCH", body: { memory_gib: Number(declare.dataset.memory) } });
      $("detail-status").textContent = `${name}: memory_gib is ${gib(Number(declare.dataset.memory))} now.`;
    } catch (error) {
      $("detail-status").textContent = `${name}: ${error.message || error}`;
    }
    return;
  }
  const button = event.target.closest("button[data-copy]");
  if (!button) return;
  const ok = await copy(button.dataset.copy);
  const what = button.getAttribute("aria-label").replace(/^Copy the /, "");
  $("detail-status").textContent = ok ? `Copied the ${what}.` : `Could not copy the ${what}: select it and copy it by hand.`;
  button.focus();
});
