// Deployment cards, their action buttons and the failure reason block (shared with the detail
// view). Cards are updated in place, so a live update never moves keyboard focus or rebuilds a
// button the user is about to press.

import { ENGINE_LABELS, LITELLM_LABELS, agoElement, memoryText, modeText, modelNames } from "./format.js";
import { devicesText } from "./devices.js";
import { cause, renderStatus } from "./status.js";

const template = document.getElementById("card-template");
const START_MARK = "--- dgxmm: starting ";
const ALARM = /error|fail|exception|traceback|fatal|panic|abort|denied|not found|no such|killed|out of memory/i;

// [action, label, className]: the order buttons appear in.
const ACTIONS = [
  ["start", "Start"], ["stop", "Stop"], ["sleep", "Sleep"], ["wake", "Wake"], ["mode", "Change mode"],
  ["edit", "Edit"], ["duplicate", "Duplicate"], ["remove", "Remove", "danger"],
];

function field(root, name) {
  return root.querySelector(`[data-field="${name}"]`);
}

/** Buttons for every action in `box`, described by the element `labelId` names. */
export function buildActions(box, labelId) {
  box.replaceChildren(...ACTIONS.map(([action, label, cls]) => {
    const b = document.createElement("button");
    b.type = "button";
    b.dataset.action = action;
    b.dataset.needsLive = "";
    b.textContent = label;
    if (cls) b.className = cls;
    b.setAttribute("aria-describedby", labelId);
    return b;
  }));
}

/** Whether `view` is declared in a file: its settings, mode and removal are the file's (the API
 * answers 409 managed_by_config), so Edit, Change mode and Remove are not offered. */
export function isDeclared(view) {
  return view.managed_by === "config";
}

/** Show the actions that apply to `view` now. */
export function updateActions(box, view) {
  const s = view.state;
  const model = !view.role || view.role === "model";
  const owned = !isDeclared(view);
  const show = {
    start: (s === "stopped" || s === "failed" || s === "planned") && !(view.status && view.status.never_fits),
    stop: !["stopped", "stopping", "planned"].includes(s),
    sleep: view.sleep_mode && s === "ready",
    wake: view.sleep_mode && s === "asleep",
    mode: model && owned,
    edit: owned && (s === "stopped" || s === "failed" || s === "planned"),
    duplicate: true,
    remove: owned,
  };
  for (const b of box.querySelectorAll("button[data-action]")) {
    b.hidden = !show[b.dataset.action];
    if (b.dataset.action === "start") b.textContent = s === "failed" ? "Retry now" : "Start";
  }
}

/**
 * A failure reason as people need it: the cause first, then the engine's last lines of the
 * attempt that failed (earlier attempts' lines, if shown at all, dimmed), alarming lines marked.
 */
export function reasonBlock(reason, { maxLines = 0, earlier = false } = {}) {
  const lines = String(reason || "").split("\n");
  const box = document.createDocumentFragment();
  const first = document.createElement("p");
  first.className = "cause";
  const strong = document.createElement("strong");
  strong.textContent = "Cause: ";
  first.append(strong, lines[0]);
  box.append(first);
  let log = lines.slice(1);
  const mark = log.map((l) => l.startsWith(START_MARK)).lastIndexOf(true);
  const before = mark >= 0 ? log.slice(0, mark) : [];
  log = mark >= 0 ? log.slice(mark) : log;
  if (maxLines) log = log.slice(-maxLines);
  if (!log.length) return box;
  const heading = document.createElement("p");
  heading.className = "help";
  heading.textContent = "The engine's last lines (the start that failed; marked lines look like errors):";
  const pre = document.createElement("pre");
  pre.className = "log log-excerpt";
  // It scrolls: reachable by keyboard, and named for a screen reader.
  pre.tabIndex = 0;
  pre.setAttribute("role", "region");
  pre.setAttribute("aria-label", "The engine's last lines");
  if (earlier && before.length) {
    for (const line of before) pre.append(logLine(line, "earlier"));
  }
  for (const line of log) pre.append(logLine(line));
  box.append(heading, pre);
  return box;
}

/** Scroll each excerpt under `root` to its last marked (error-like) line: the cause, not the
 * dozens of health checks before it. */
export function scrollToMark(root) {
  for (const pre of root.querySelectorAll("pre.log-excerpt")) {
    const marks = pre.querySelectorAll("mark.alarm");
    const last = marks[marks.length - 1];
    if (last) pre.scrollTop = Math.max(0, last.offsetTop - pre.offsetTop - pre.clientHeight / 3);
  }
}

/** One log line as a block; alarming ones are marked with a sign as well as a colour. */
export function logLine(text, extra = "") {
  const alarm = ALARM.test(text) && !text.startsWith(START_MARK);
  const line = document.createElement(alarm ? "mark" : "span");
  line.className = `line${alarm ? " alarm" : ""}${extra ? ` ${extra}` : ""}`;
  line.textContent = `${alarm ? "▸ " : ""}${text}\n`;
  return line;
}

export function createCard(view) {
  const card = template.content.firstElementChild.cloneNode(true);
  card.dataset.id = view.id;
  const link = field(card, "name");
  link.id = `dep-${view.id}-name`;
  link.href = `#deployment/${encodeURIComponent(view.id)}`;
  card.querySelector("article").setAttribute("aria-labelledby", link.id);
  buildActions(card.querySelector(".actions"), link.id);
  updateCard(card, view);
  return card;
}

export function updateCard(card, view) {
  field(card, "name").textContent = view.name;
  renderStatus(field(card, "status"), field(card, "status_detail"), view);
  field(card, "served_name").textContent = modelNames(view);
  field(card, "engine").textContent = ENGINE_LABELS[view.engine] || view.engine;
  field(card, "memory").textContent = memoryText(view);
  const gpus = devicesText(view); // nothing on a pooled host
  card.querySelector("[data-gpus]").hidden = !gpus;
  field(card, "gpus").textContent = gpus;
  card.querySelector("[data-speed]").hidden = view.tokens_per_s == null;
  field(card, "speed").textContent = view.tokens_per_s == null ? "" : `${view.tokens_per_s} tokens/s`;
  field(card, "mode").textContent = modeText(view);
  const od = view.mode === "on_demand";
  card.querySelector("[data-ondemand]").hidden = !od;
  if (od) field(card, "last_request").replaceChildren(lastRequest(view));
  const lite = view.litellm || { status: "disabled" };
  card.querySelector("[data-litellm]").hidden = lite.status === "disabled";
  field(card, "litellm").textContent =
    (LITELLM_LABELS[lite.status] || lite.status) + (lite.error ? ` (${lite.error})` : "");
  card.querySelector("[data-declared]").hidden = !isDeclared(view);
  field(card, "declared_in").textContent = view.declared_in || "";

  const reason = field(card, "reason");
  const failed = view.state === "failed" && view.state_reason;
  reason.hidden = !failed;
  if (failed && reason.dataset.shown !== view.state_reason) {
    reason.dataset.shown = view.state_reason;
    reason.replaceChildren(reasonBlock(view.state_reason, { maxLines: 4 }));
  }
  const last = lastFailure(view);
  const lastEl = field(card, "last_failure");
  lastEl.hidden = !last;
  if (last) lastEl.replaceChildren("Last start failed ", agoElement(last.at), `: ${cause(last.reason)}`);
  updateActions(card.querySelector(".actions"), view);
  card.classList.toggle("is-failed", view.state === "failed");
}

/** The latest failed start to show, null when an edit came after it: the API moves a failed
 * deployment whose settings change to stopped with this reason, and that failure was the old
 * settings', so neither its cause nor its log lines are shown any more. */
export const EDITED_AFTER_FAILURE = "Settings changed since the failed start";
export function lastFailure(view) {
  const last = view.status && view.status.last_failure;
  const edited = view.state === "stopped" && view.state_reason === EDITED_AFTER_FAILURE;
  return last && !(edited && view.state_changed_at >= last.at) ? last : null;
}

/** "Last request": a relative time, or why there is none to show. */
export function lastRequest(view) {
  const at = view.status && view.status.last_request_at;
  if (at) return agoElement(at);
  return "none since dgxmm started";
}

export function setCardError(card, message) {
  const el = field(card, "error");
  el.textContent = message || "";
  el.hidden = !message;
}
