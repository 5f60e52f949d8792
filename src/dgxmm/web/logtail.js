// The live tail of an engine's log in the detail view: it follows api/deployments/{id}/logs/follow
// and scrolls with new lines; Pause keeps the view still (new lines are counted, not shown) until
// Follow shows them. At most MAX_LINES stay on the page. Health and metrics probes are hidden
// unless asked for, a search hides the lines without its text, and Download saves the lines the
// page holds (issue 41 item 14). A line that arrives while the page follows shows the time it
// came; the tail the page opens with has none (the engine's log carries no times of its own).

import { EventStream } from "./api.js";
import { logLine } from "./cards.js";
import { clock } from "./format.js";

const MAX_LINES = 2000;
const pre = document.getElementById("detail-log");
const toggle = document.getElementById("log-toggle");
const state = document.getElementById("log-state");
let stream = null;
let paused = false;
let held = []; // lines that arrived while paused (the newest MAX_LINES)
let heldCount = 0;
let shown = 0;
let texts = []; // the lines on the page, for Download
const probes = document.getElementById("log-probes");
const search = document.getElementById("log-search");
const matches = document.getElementById("log-matches");
const download = document.getElementById("log-download");
// llama-server's "request: GET /health 127.0.0.1 200", vLLM's "GET /metrics HTTP/1.1" 200, ...
const PROBE = /\b(GET|HEAD) \/(health|metrics|v1\/models|slots)\b/;
pre.classList.add("hide-probes");

/** Hide the lines without the searched text, and say how many match. */
function filter(lines = pre.children) {
  const needle = search.value.trim().toLowerCase();
  for (const line of lines) line.classList.toggle("miss", Boolean(needle) && !line.textContent.toLowerCase().includes(needle));
  if (!needle) matches.textContent = "";
  else {
    const found = [...pre.children].filter((l) => !l.classList.contains("miss")
      && !(pre.classList.contains("hide-probes") && l.classList.contains("probe"))).length;
    matches.textContent = `${found} of ${pre.children.length} lines match.`;
  }
}

function say() {
  if (!stream) state.textContent = "";
  else if (paused) state.textContent = `Paused. ${heldCount} new line${heldCount === 1 ? "" : "s"} since.`;
  else state.textContent = "Following the engine's output as it is written.";
  toggle.textContent = paused ? "Follow" : "Pause";
  toggle.setAttribute("aria-pressed", String(paused));
}

function append(lines, at = null) {
  if (!lines.length) return;
  const frag = document.createDocumentFragment();
  const made = [];
  for (const [i, line] of lines.entries()) {
    const el = logLine(line, PROBE.test(line) ? "probe" : "");
    const when = Array.isArray(at) ? at[i] : at;
    if (when) el.dataset.time = clock(when);
    made.push(el);
    frag.append(el);
  }
  pre.append(frag);
  texts.push(...lines.map((line, i) => {
    const when = Array.isArray(at) ? at[i] : at;
    return when ? `${new Date(when * 1000).toISOString()} ${line}` : line;
  }));
  shown += lines.length;
  while (shown > MAX_LINES && pre.firstChild) {
    pre.firstChild.remove();
    shown -= 1;
  }
  texts = texts.slice(-MAX_LINES);
  filter(made);
  pre.scrollTop = pre.scrollHeight;
}

function clear() {
  pre.replaceChildren();
  shown = 0;
  texts = [];
  held = [];
  heldTimes = [];
  heldCount = 0;
}

let heldTimes = []; // when each held line arrived
let logName = "engine";

/** Follow the log of deployment `id` (stopping any earlier one). */
export function followLog(id, { unauthorized, name = id }) {
  stopLog();
  clear();
  logName = name;
  paused = false;
  let first = true;
  stream = new EventStream({
    open() {
      first = true;
    },
    event(type, data) {
      if (type !== "lines") return;
      const tail = first; // the lines already written: their times are unknown
      if (first) {
        // The tail again after a reconnect: start over so nothing is shown twice.
        clear();
        first = false;
      }
      const now = tail ? null : Date.now() / 1000;
      if (paused) {
        held = [...held, ...data.lines].slice(-MAX_LINES);
        heldTimes = [...heldTimes, ...data.lines.map(() => now)].slice(-MAX_LINES);
        heldCount += data.lines.length;
      } else {
        append(data.lines, now);
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
    append(held, heldTimes);
    held = [];
    heldTimes = [];
    heldCount = 0;
  }
  say();
});

probes.addEventListener("change", () => {
  pre.classList.toggle("hide-probes", !probes.checked);
  filter([]);
});
search.addEventListener("input", () => filter());
download.addEventListener("click", () => {
  const url = URL.createObjectURL(new Blob([texts.join("\n") + "\n"], { type: "text/plain" }));
  const link = document.createElement("a");
  link.href = url;
  link.download = `${logName}-engine.log`;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
});
