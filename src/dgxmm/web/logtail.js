// The live tail of an engine's log in the detail view: it follows api/deployments/{id}/logs/follow
// and scrolls with new lines; Pause keeps the view still (new lines are counted, not shown) until
// Follow shows them. At most MAX_LINES stay on the page.

import { EventStream } from "./api.js";
import { logLine } from "./cards.js";

const MAX_LINES = 2000;
const pre = document.getElementById("detail-log");
const toggle = document.getElementById("log-toggle");
const state = document.getElementById("log-state");
let stream = null;
let paused = false;
let held = []; // lines that arrived while paused (the newest MAX_LINES)
let heldCount = 0;
let shown = 0;

function say() {
  if (!stream) state.textContent = "";
  else if (paused) state.textContent = `Paused. ${heldCount} new line${heldCount === 1 ? "" : "s"} since.`;
  else state.textContent = "Following the engine's output as it is written.";
  toggle.textContent = paused ? "Follow" : "Pause";
  toggle.setAttribute("aria-pressed", String(paused));
}

function append(lines) {
  if (!lines.length) return;
  const frag = document.createDocumentFragment();
  for (const line of lines) frag.append(logLine(line));
  pre.append(frag);
  shown += lines.length;
  while (shown > MAX_LINES && pre.firstChild) {
    pre.firstChild.remove();
    shown -= 1;
  }
  pre.scrollTop = pre.scrollHeight;
}

/** Follow the log of deployment `id` (stopping any earlier one). */
export function followLog(id, { unauthorized }) {
  stopLog();
  pre.replaceChildren();
  shown = 0;
  held = [];
  heldCount = 0;
  paused = false;
  let first = true;
  stream = new EventStream({
    open() {
      first = true;
    },
    event(type, data) {
      if (type !== "lines") return;
      if (first) {
        // The tail again after a reconnect: start over so nothing is shown twice.
        pre.replaceChildren();
        shown = 0;
        held = [];
        heldCount = 0;
        first = false;
      }
      if (paused) {
        held = [...held, ...data.lines].slice(-MAX_LINES);
        heldCount += data.lines.length;
      } else {
        append(data.lines);
      }
      say();
    },
    closed() {
      state.textContent = "The log stream dropped; reconnecting…";
    },
    unauthorized,
    refused() {
      state.textContent = "This deployment no longer exists.";
    },
  }, `deployments/${encodeURIComponent(id)}/logs/follow?tail=200`);
  stream.start();
  say();
}

export function stopLog() {
  if (stream) stream.stop();
  stream = null;
  say();
}

toggle.addEventListener("click", () => {
  paused = !paused;
  if (!paused) {
    append(held);
    held = [];
    heldCount = 0;
  }
  say();
});
