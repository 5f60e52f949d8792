// The requests waiting now for the deployment the detail view shows (issue 41 item 12): since
// when, for what (memory, a start, their turn under max_concurrent, a drain), at what priority
// (their caller key's, in the order they are served), when their queue
// timeout ends, and a Cancel per request (its caller gets 503 ondemand_cancelled). Read again
// whenever a fresh view of the deployment says its counts moved, and after a cancel.

import { api } from "./api.js";
import { cell } from "./activity.js";
import { timeElement } from "./format.js";

const $ = (id) => document.getElementById(id);
const panel = $("detail-waiting-panel");
const body = $("detail-waiting");
const status = $("detail-waiting-status");
let current = null; // the deployment id shown
let counts = ""; // its counts when the list was last read
let timer = null;

/** What a request waits for, in words. */
export function waitsForText(kind, view) {
  const limit = view && view.max_concurrent;
  return {
    memory: "memory (in the queue)",
    turn: limit ? `its turn (${limit} at once)` : "its turn",
    start: "the model to start",
    drain: "the model's turn after a drain",
    stop: "the engine to stop, then a start",
    planned: "the model's preparation",
    engine: "the engine to be started",
  }[kind] || kind;
}

function row(r, view) {
  const tr = document.createElement("tr");
  const cancel = document.createElement("button");
  cancel.type = "button";
  cancel.className = "danger";
  cancel.dataset.cancel = r.id;
  cancel.dataset.request = r.request_id;
  cancel.textContent = "Cancel";
  cancel.setAttribute("aria-label", `Cancel request ${r.request_id}`);
  const code = document.createElement("code");
  code.textContent = r.request_id;
  tr.append(cell("Request", code), cell("Waiting since", timeElement(r.since)),
    cell("For", waitsForText(r.waits_for, view)), cell("Priority", String(r.priority ?? 0)), cell("Gives up at", timeElement(r.until)), cell("", cancel));
  return tr;
}

async function load(view) {
  const id = view.id;
  let rows;
  try {
    rows = await api(`deployments/${encodeURIComponent(id)}/waiting`);
  } catch {
    return; // gone, or the connection: the next view reads it again
  }
  if (id !== current) return;
  body.replaceChildren(...rows.map((r) => row(r, view)));
  panel.hidden = rows.length === 0;
  $("d-waiting-title").textContent = rows.length ? `Waiting now (${rows.length})` : "Waiting now";
}

/** A fresh view of the deployment shown: read the list again when its counts moved. */
export function showWaiting(view) {
  const now = JSON.stringify([view.ondemand && view.ondemand.queued, view.status && view.status.waiting,
    view.status && view.status.count, view.state]);
  if (view.id === current && now === counts) return;
  if (view.id !== current) {
    current = view.id;
    status.textContent = "";
    body.replaceChildren();
    panel.hidden = true;
  }
  counts = now;
  clearTimeout(timer);
  timer = setTimeout(() => load(view), 150); // once for a burst of views
}

export function closeWaiting() {
  current = null;
  counts = "";
  clearTimeout(timer);
}

body.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-cancel]");
  if (!button || button.disabled) return;
  button.disabled = true;
  const request = button.dataset.request;
  try {
    await api(`waiting/${encodeURIComponent(button.dataset.cancel)}/cancel`, { method: "POST" });
    status.textContent = `Cancelled request ${request}: its caller got 503 ondemand_cancelled.`;
  } catch (error) {
    status.textContent = error.status === 404
      ? `Request ${request} is no longer waiting (served or gone).`
      : `Request ${request}: ${error.message}`;
  }
  const tr = button.closest("tr");
  const next = tr.nextElementSibling || tr.previousElementSibling;
  tr.remove();
  panel.hidden = body.children.length === 0;
  (next ? next.querySelector("button[data-cancel]") : $("detail-actions").querySelector("button:not([disabled])"))?.focus();
});
