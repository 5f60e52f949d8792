// The requests view (#requests): the activity log, every gateway request with what it waited
// for and what it cost, newest first by arrival, live while the view is open (a record comes as
// its request ends, and takes its place by arrival), filtered by model, status and caller key,
// under the usage per model and per key today and in the last hour (usage.js).
// A row opens its details: every field, the engine's last lines as the request ended (its log up
// to the record's engine_log_at), and a link to the deployment whose whole log is there.

import { EventStream, api } from "./api.js";
import { cell } from "./activity.js";
import { clock, timeElement } from "./format.js";
import { loadUsage } from "./usage.js";

const MAX_ROWS = 500;
const ENGINE_LINES = 20;
const LATELY = 50; // the latest live records, put back after a reload that may not have had them
const lately = [];
const body = document.getElementById("requests-rows");
const filters = document.getElementById("requests-filters");
let live = null;
let usageTimer = null; // the usage read again a second after records came
let usageClock = null; // and every 30 s: minutes leave the last hour
let onUnauthorized = () => {};

export function setUnauthorizedHandler(handler) {
  onUnauthorized = handler;
}

function secs(value) {
  return value == null ? "—" : `${Number(value).toFixed(value < 10 ? 2 : 1)} s`;
}

/** The first byte the caller got and, when dgxmm's queued notice came first, the engine's first
 * token (ttft_s) beside it: the notice is sent at once, the token after the wait. */
function firstByte(r) {
  if (r.ttft_s == null || r.ttfb_s == null || r.ttft_s - r.ttfb_s < 0.01) return secs(r.ttfb_s ?? r.ttft_s);
  return `${secs(r.ttfb_s)} notice, first token ${secs(r.ttft_s)}`;
}

/** The model: the deployment's served name, else the name the caller gave the router (one that
 * no deployment has, refused). */
function modelOf(r) {
  if (r.served_name) return r.served_name;
  return r.model ? `${r.model} (no such model)` : "—";
}

/** A share of the model's files in the page cache, as a percentage. */
function percent(fraction) {
  return `${Math.round(fraction * 100)} %`;
}

/** What the request waited for: how long and, for a start, the engine's load and how much of
 * its model was in the page cache as that start began. */
function waited(r) {
  let start = "";
  if (r.cold_start) {
    const facts = r.load_s == null ? [] : [`load ${secs(r.load_s)}`];
    if (r.cached_fraction != null) facts.push(`${percent(r.cached_fraction)} cached`);
    start = facts.length ? `cold start: ${facts.join(", ")}` : "cold start";
  }
  if (!r.queued_s) return start || "—";
  return start ? `${secs(r.queued_s)} (${start})` : secs(r.queued_s);
}

function tokens(r) {
  if (r.prompt_tokens == null && r.completion_tokens == null) return "—";
  return `${r.prompt_tokens ?? "?"} → ${r.completion_tokens ?? "?"}`;
}

const OUTCOMES = {
  answered: "Answered", engine_error: "Engine error", hang_up: "Caller left", queue_timeout: "Queue timeout",
  queue_full: "Queue full", start_failed: "Start failed", does_not_fit: "Does not fit",
  upstream_error: "Engine broke off", refused: "Refused", health_check: "Health check",
};

function matches(r) {
  const model = filters.elements.model.value.trim().toLowerCase();
  const status = filters.elements.status.value;
  const key = filters.elements.key.value;
  if (key && r.key !== key) return false;
  if (model && !`${r.served_name || ""} ${r.deployment_id || ""} ${r.model || ""}`.toLowerCase().includes(model)) return false;
  if (status === "errors") return r.outcome !== "answered";
  if (status === "cold") return r.cold_start;
  return true;
}

/** Under an empty list: nothing at all yet, or nothing these filters let through. */
function showEmpty() {
  const empty = document.getElementById("requests-empty");
  empty.hidden = body.rows.length > 0;
  const { model, status, key } = filters.elements;
  const filtered = model.value.trim() || status.value !== "all" || key.value;
  empty.textContent = filtered ? "No requests match these filters." : "No requests yet.";
}

function row(r) {
  const tr = document.createElement("tr");
  tr.dataset.requestId = r.request_id;
  tr.dataset.time = String(r.time);
  const open = document.createElement("button");
  open.type = "button";
  open.className = "link";
  open.textContent = r.request_id;
  open.setAttribute("aria-expanded", "false");
  open.setAttribute("aria-label", `Details of request ${r.request_id}`);
  tr.append(
    cell("Time", timeElement(r.time)), cell("Request", open), cell("Model", modelOf(r)), cell("Key", r.key || "—"),
    cell("Status", String(r.status)), cell("Outcome", OUTCOMES[r.outcome] || r.outcome),
    cell("Queued", waited(r)),
    cell("First byte", firstByte(r)), cell("Took", secs(r.duration_s)), cell("Tokens", tokens(r)),
    cell("Tokens/s", r.tokens_per_s == null ? "—" : String(r.tokens_per_s)),
  );
  open.addEventListener("click", () => toggle(tr, r, open));
  return tr;
}

/** The engine's last lines as the request ended (its log up to `engine_log_at`), fetched. */
function engineLines(r) {
  const box = document.createElement("div");
  const heading = document.createElement("p");
  heading.className = "help";
  heading.textContent = `The engine's last ${ENGINE_LINES} lines as the request ended:`;
  const pre = document.createElement("pre");
  pre.className = "log log-excerpt";
  pre.tabIndex = 0;
  pre.setAttribute("aria-label", "The engine's lines as the request ended");
  box.append(heading, pre);
  api(`deployments/${encodeURIComponent(r.deployment_id)}/logs?tail=${ENGINE_LINES}&before=${r.engine_log_at}`)
    .then((answer) => {
      pre.textContent = answer.lines.join("\n") || "(nothing written)";
      pre.scrollTop = pre.scrollHeight;
    })
    .catch((error) => { pre.textContent = `(the engine log cannot be read: ${error.message})`; });
  return box;
}

// The record's fields in words (issue 41 item 14); the raw name stays as the term's tooltip.
const LABELS = {
  time: "Arrived", request_id: "Request ID", deployment_id: "Deployment ID", served_name: "Deployment",
  model: "Model asked for", route: "Route", status: "HTTP status", stream: "Streamed", queued_s: "Queued for",
  cold_start: "Cold start", load_s: "Engine load", cached_fraction: "In the page cache as the start began", ttfb_s: "First byte", ttft_s: "First token", duration_s: "Took",
  prompt_tokens: "Prompt tokens", completion_tokens: "Completion tokens", tokens_per_s: "Generation speed",
  client: "Client", key: "Caller key", priority: "Priority", outcome: "Outcome", engine_log_at: "Engine log position",
};

/** A field's value as a person reads it: times as times, seconds and rates with their units. */
function readable(key, value) {
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (typeof value === "number" && (key === "time" || (key.endsWith("_at") && key !== "engine_log_at"))) {
    return clock(value);
  }
  // (a rate before the durations: "tokens_per_s" ends in "_s" too)
  if (key === "tokens_per_s") return `${Number(Number(value).toFixed(1))} tokens/s`;
  if (typeof value === "number" && key.endsWith("_s")) return `${Number(value.toFixed(3))} s`;
  if (key === "cached_fraction") return `${percent(value)} of the model's files`;
  return typeof value === "object" ? JSON.stringify(value) : String(value);
}

function toggle(tr, r, button) {
  const next = tr.nextElementSibling;
  if (next && next.classList.contains("request-detail")) {
    next.remove();
    button.setAttribute("aria-expanded", "false");
    return;
  }
  const detail = document.createElement("tr");
  detail.className = "request-detail";
  const td = document.createElement("td");
  td.colSpan = tr.cells.length;
  const list = document.createElement("dl");
  list.className = "facts";
  for (const [key, value] of Object.entries(r)) {
    if (value == null || value === "") continue; // what is not known is left out
    const div = document.createElement("div");
    div.dataset.key = key;
    const dt = document.createElement("dt");
    dt.textContent = LABELS[key] || key.replace(/_/g, " ").replace(/^./, (c) => c.toUpperCase());
    dt.title = key;
    const dd = document.createElement("dd");
    dd.textContent = readable(key, value);
    div.append(dt, dd);
    list.append(div);
  }
  td.append(list);
  if (r.deployment_id) {
    if (r.engine_log_at != null) td.append(engineLines(r));
    const link = document.createElement("a");
    link.href = `#deployment/${encodeURIComponent(r.deployment_id)}`;
    link.textContent = `The engine log of ${r.served_name || r.deployment_id}`;
    td.append(link);
  }
  detail.append(td);
  tr.after(detail);
  button.setAttribute("aria-expanded", "true");
}

/** A record in its place by arrival, newest first: a live one (records come as requests end) goes
 * above the first row that arrived no later than it, below the ones that came after it. */
function add(r, live) {
  if (!matches(r)) return;
  const rows = live ? [...body.querySelectorAll("tr:not(.request-detail)")] : [];
  // a record the stream brings that the reload on its opening already listed
  if (rows.some((other) => other.dataset.requestId === r.request_id && Number(other.dataset.time) === r.time)) return;
  const tr = row(r);
  const before = rows.find((other) => Number(other.dataset.time) <= r.time);
  if (before) before.before(tr);
  else body.append(tr);
  while (body.querySelectorAll("tr:not(.request-detail)").length > MAX_ROWS) body.lastElementChild.remove();
  showEmpty();
}

async function load() {
  const key = filters.elements.key.value; // the API's filter: the 200 latest of that key
  const rows = await api(`activity?limit=200${key ? `&key=${encodeURIComponent(key)}` : ""}`);
  // details the user opened stay open (the live stream's opening reloads the list just after the view's)
  const shown = (tr) => `${tr.dataset.requestId} ${tr.dataset.time}`;
  const opened = new Set([...body.querySelectorAll('button[aria-expanded="true"]')].map((b) => shown(b.closest("tr"))));
  body.replaceChildren();
  for (const r of rows) add(r, false);
  // the live records that may have come while the list was read, each in its place (once)
  for (const r of lately) add(r, true);
  showEmpty();
  for (const tr of body.querySelectorAll("tr:not(.request-detail)")) {
    if (opened.has(shown(tr))) tr.querySelector("button").click();
  }
}

/** The usage tables, and the key filter's choices (a chosen key that is gone stays one). */
async function usage() {
  const names = await loadUsage();
  const select = filters.elements.key;
  const chosen = select.value;
  const options = ["", ...new Set([...names, ...(chosen ? [chosen] : [])])].map((name) => {
    const option = new Option(name || "All keys", name);
    option.selected = name === chosen;
    return option;
  });
  select.replaceChildren(...options);
}

function usageSoon() {
  if (usageTimer) return;
  usageTimer = setTimeout(() => {
    usageTimer = null;
    usage().catch(() => {});
  }, 1000);
}

/** The view opened: load the latest records, then follow new ones. */
export function openRequests() {
  load().catch(() => {});
  usage().catch(() => {});
  clearInterval(usageClock);
  usageClock = setInterval(() => usage().catch(() => {}), 30000);
  if (live) return;
  live = new EventStream({
    open() { load().catch(() => {}); },
    event(type, data) {
      if (type !== "activity") return;
      lately.push(data);
      if (lately.length > LATELY) lately.shift();
      add(data, true);
      usageSoon();
    },
    closed() {},
    unauthorized() { onUnauthorized(); },
  }, "activity/stream");
  live.start();
}

export function closeRequests() {
  if (live) live.stop();
  live = null;
  clearInterval(usageClock);
  clearTimeout(usageTimer);
  usageTimer = null;
}

filters.addEventListener("input", () => load().catch(() => {}));
filters.addEventListener("submit", (event) => event.preventDefault());
