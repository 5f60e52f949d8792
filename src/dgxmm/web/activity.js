// The events and audit view: the latest event rows (live from the stream) and the audit rows.

import { api } from "./api.js";
import { timeElement } from "./format.js";

const MAX_EVENTS = 200;
const eventsBody = document.getElementById("events-rows");
const auditBody = document.getElementById("audit-rows");
const seen = new Set();
let nameOf = (id) => id;
let auditTimer = null;

/** `resolve(id)` gives a deployment's name (removed ones included) for the tables. */
export function setNameResolver(resolve) {
  nameOf = (id) => (id ? resolve(id) || id : "");
}

export function cell(label, content) {
  const td = document.createElement("td");
  td.dataset.label = label;
  if (content instanceof Node) td.append(content);
  else td.textContent = content == null ? "" : String(content);
  return td;
}

function eventKey(row) {
  return `${row.time}|${row.deployment_id}|${row.actor}|${row.text}`;
}

function eventRow(row) {
  const tr = document.createElement("tr");
  const dep = cell("Deployment", nameOf(row.deployment_id));
  dep.dataset.id = row.deployment_id || "";
  tr.append(cell("Time", timeElement(row.time)), cell("Actor", row.actor), dep, cell("Event", row.text));
  return tr;
}

function syncEmpty() {
  document.getElementById("events-empty").hidden = eventsBody.rows.length > 0;
  document.getElementById("audit-empty").hidden = auditBody.rows.length > 0;
}

/** A live `event: log` row: newest first, at most MAX_EVENTS kept. */
export function addEvent(row) {
  const key = eventKey(row);
  if (seen.has(key)) return;
  seen.add(key);
  eventsBody.prepend(eventRow(row));
  while (eventsBody.rows.length > MAX_EVENTS) eventsBody.lastElementChild.remove();
  syncEmpty();
  refreshAuditSoon();
}

/** After each (re)connect: the stored history, so nothing missed while disconnected is lost. */
export async function loadEvents() {
  const rows = await api(`events/history?limit=${MAX_EVENTS}`);
  seen.clear();
  const trs = [];
  for (const row of rows.reverse()) {
    seen.add(eventKey(row));
    trs.push(eventRow(row));
  }
  eventsBody.replaceChildren(...trs);
  syncEmpty();
}

const SUMMARY_KEYS = ["name", "engine", "memory_gib", "mode", "idle_timeout_s", "state"];

function show(value, keys) {
  if (value == null) return "—";
  if (typeof value !== "object") return String(value);
  const fmt = (v) => (typeof v === "string" ? v : JSON.stringify(v));
  return keys.filter((k) => k in value).map((k) => `${k}=${fmt(value[k])}`).join(", ") || "—";
}

/** old → new, compact: only what changed, or a summary of a whole created or removed record. */
export function change(old, next) {
  if (old == null && next == null) return "";
  const isObj = (v) => v !== null && typeof v === "object";
  let keys;
  if (isObj(old) && isObj(next)) {
    keys = [...new Set([...Object.keys(old), ...Object.keys(next)])]
      .filter((k) => JSON.stringify(old[k]) !== JSON.stringify(next[k]));
  } else {
    const whole = isObj(old) ? old : next;
    keys = whole && Object.keys(whole).length > 4 ? SUMMARY_KEYS : Object.keys(whole || {});
  }
  const text = `${show(old, keys)} → ${show(next, keys)}`;
  const full = JSON.stringify({ old, new: next }, null, 1);
  if (full.length < 200) return text;
  const details = document.createElement("details");
  const summary = document.createElement("summary");
  summary.textContent = text;
  const pre = document.createElement("pre");
  pre.textContent = full;
  details.append(summary, pre);
  return details;
}

export async function loadAudit() {
  const rows = await api(`audit?limit=${MAX_EVENTS}`);
  auditBody.replaceChildren(...rows.map((row) => {
    const tr = document.createElement("tr");
    tr.append(cell("Time", timeElement(row.time)), cell("User", row.user || "—"), cell("Actor", row.actor),
      cell("Action", row.action), cell("Deployment", nameOf(row.deployment_id)),
      cell("Change", change(row.old, row.new)), cell("Details", row.text));
    return tr;
  }));
  syncEmpty();
}

function refreshAuditSoon() {
  if (document.getElementById("activity-view").hidden) return;
  clearTimeout(auditTimer);
  auditTimer = setTimeout(() => loadAudit().catch(() => {}), 500);
}

export function refreshNames() {
  // Names of deployments created after their rows arrived: redraw only the deployment cells.
  for (const td of eventsBody.querySelectorAll("td[data-id]")) td.textContent = nameOf(td.dataset.id);
}
