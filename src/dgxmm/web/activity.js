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

function cell(label, content) {
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

function change(old, next) {
  const show = (v) => (v == null ? "" : Object.entries(v).map(([k, x]) => `${k}=${x}`).join(", "));
  const a = show(old);
  const b = show(next);
  return a || b ? `${a || "—"} → ${b || "—"}` : "";
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
