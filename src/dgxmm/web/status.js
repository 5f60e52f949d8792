// The honest status of a deployment (the view's `status`, computed by dgxmm) as people read it:
// one badge with a shape as well as a colour, a time that counts up or down on the page, and a
// sentence saying why. A ticker repaints the times every second without asking dgxmm again.

import { spanOf } from "./devices.js";
import { agoText, gib, mmss } from "./format.js";

// Shapes, so Loading, Ready, Failed... differ without colour too (transitional ones also get a
// dashed border).
export const GLYPHS = {
  cold: "○", loading: "◐", serving: "▶", idle: "●", ready: "●", queued: "◷", asleep: "☾",
  failed: "✕", switching: "⇄", stopping: "▣", stopped: "□", planned: "◇", too_big: "⊘",
};
const TRANSITIONAL = new Set(["loading", "queued", "switching", "stopping"]);

// Status filter values of the toolbar, by status code.
export const FILTER_OF = {
  serving: "serving", idle: "idle", ready: "idle", loading: "loading", switching: "loading",
  queued: "queued", cold: "cold", stopped: "cold", planned: "cold", stopping: "cold", too_big: "cold",
  asleep: "asleep", failed: "failed",
};

function names(list) {
  const n = list.map((d) => d.name);
  return n.length < 2 ? n.join("") : `${n.slice(0, -1).join(", ")} and ${n[n.length - 1]}`;
}

function plural(count, word) {
  return `${count} ${word}${count === 1 ? "" : "s"}`;
}

function seconds(s) {
  return s < 60 ? `${Math.max(0, Math.floor(s))} s` : mmss(s);
}

/** What a queued deployment waits for, in words (the `waits_for` object, and what it says
 * comes after it: a stop that frees too little is followed by the rest of the wait). */
export function waitsText(wait, now) {
  if (!wait) return "";
  const first = oneWait(wait, now);
  if (!wait.then) return first;
  if (wait.then.kind === "nothing") return `${first}, but nothing dgxmm can stop would free the rest`;
  return `${first}, then ${oneWait(wait.then, now).replace(/^waits /, "")}`;
}

function oneWait(wait, now) {
  const who = names(wait.deployments || []);
  switch (wait.kind) {
    case "queue": return `waits behind ${who} in the queue`;
    case "free": return "memory is free: it starts next";
    case "release": return `waits for the memory ${who} held to show as free`;
    case "stop": return `waits for ${who} to finish stopping`;
    case "drain": return `waits its turn: ${who} finishes what it serves, then stops`;
    case "victim": {
      const left = wait.at - now;
      return `waits for ${who} idling out ${left > 0.5 ? `in ${mmss(left)}` : "now"}`;
    }
    case "start": return `waits for a start in progress (${who})`;
    case "busy": return `waits for ${who} to finish serving and idle out`;
    default: return "waits, but nothing dgxmm can stop would free enough memory";
  }
}

/** How far the prefetch of a waiting model's files is: "Prefetching 4.1 of 18 GiB" (a model
 * under 1 GiB in MiB). */
function prefetchText(p) {
  const unit = p.bytes_total < 1024 ** 3 ? 1024 ** 2 : 1024 ** 3;
  const n = (bytes) => Number((bytes / unit).toFixed(1));
  return `Prefetching ${n(p.bytes_done)} of ${n(p.bytes_total)} ${unit === 1024 ** 2 ? "MiB" : "GiB"} of its model into the page cache.`;
}

/** The first line of a failure reason: the cause. */
export function cause(reason) {
  return String(reason || "").split("\n")[0];
}

/** Badge label, live time and detail sentence of `view`'s status at `now` (Unix seconds). */
export function describe(view, now) {
  const s = view.status || { code: view.state, label: view.state };
  const parts = [];
  let time = "";
  const onDemand = view.mode === "on_demand";
  switch (s.code) {
    case "loading":
    case "switching":
      if (s.since) time = `for ${seconds(now - s.since)}`;
      if (s.code === "switching") parts.push("It becomes always on once it has started.");
      if (s.waiting_for_gate) parts.push("Waiting for another engine to finish loading.");
      if (s.last_cold_start_s != null) parts.push(`Last cold start ${Number(s.last_cold_start_s).toFixed(1)} s.`);
      if (s.count) parts.push(`${plural(s.count, "request")} waiting.`);
      break;
    case "idle":
    case "asleep":
      if (s.until != null) time = s.until > now ? `stops in ${mmss(s.until - now)}` : "stops at the reaper's next pass";
      break;
    case "queued":
      parts.push(`Needs ${gib(s.needs_gib)}; ${waitsText(s.waits_for, now) || "waits for memory"}.`);
      break;
    case "failed":
      if (s.until != null && s.until > now) {
        time = `starts refused for ${mmss(s.until - now)} more`;
        parts.push("Requests start it again by themselves after that; Retry now starts it at once.");
      } else if (onDemand) {
        parts.push("The next request tries again.");
      }
      break;
    case "planned": // its model's files download: the reason says how far
      if (view.state_reason) parts.push(`${view.state_reason}.`);
      if (s.count) parts.push(`${plural(s.count, "request")} waiting for it.`);
      break;
    case "cold":
      if (s.count) parts.push(`${plural(s.count, "request")} waiting: starting it.`);
      else if (view.state_reason === "dgxmm restarted") parts.push("Stopped when dgxmm restarted; the next request starts it.");
      else parts.push("The next request starts it.");
      break;
    case "stopped":
      if (view.state_reason) parts.push(view.state_reason === "dgxmm restarted" ? "Stopped when dgxmm restarted." : view.state_reason);
      break;
    default:
      break;
  }
  if (view.prefetch) parts.push(prefetchText(view.prefetch));
  if (s.never_fits && s.never_fits.per_device) {
    const span = spanOf(view);
    const needs = gib(s.never_fits.needs_gib);
    parts.push(`It cannot fit now: it needs ${needs} on ${span > 1 ? `each of its ${span} devices` : "one device"}, and `
      + `on-demand models can get at most ${gib(s.never_fits.capacity_gib)} on a device it may use. It would need `
      + `${span > 1 ? "devices" : "a device"} of ${needs} or more, so its requests are refused (does_not_fit).`);
  } else if (s.never_fits) {
    parts.push(`It cannot fit now: on-demand models can get at most ${gib(s.never_fits.capacity_gib)} here, `
      + `so its requests are refused (does_not_fit).`);
  }
  return { code: s.code, label: s.label, time, detail: parts.join(" ") };
}

const painted = new Map(); // status element -> { view, detail }

function badgeOf(el) {
  let badge = el.querySelector(".badge");
  if (!badge) {
    badge = document.createElement("span");
    badge.setAttribute("aria-live", "polite");
    badge.setAttribute("aria-atomic", "true");
    const glyph = document.createElement("span");
    glyph.className = "glyph";
    glyph.setAttribute("aria-hidden", "true");
    const label = document.createElement("span");
    label.className = "label";
    const time = document.createElement("span");
    time.className = "status-time";
    badge.append(glyph, label);
    el.replaceChildren(badge, time);
  }
  return badge;
}

function paint(el, detail, view, now) {
  const d = describe(view, now);
  const badge = badgeOf(el);
  badge.className = `badge status-${d.code}${TRANSITIONAL.has(d.code) ? " transitional" : ""}`;
  badge.dataset.status = d.code;
  badge.querySelector(".glyph").textContent = GLYPHS[d.code] || "•";
  const label = badge.querySelector(".label");
  if (label.textContent !== d.label) label.textContent = d.label;
  el.querySelector(".status-time").textContent = d.time;
  if (detail) {
    detail.textContent = d.detail;
    detail.hidden = !d.detail;
  }
}

/** Show `view`'s status in `el` (and its sentence in `detail`); the ticker keeps it current. */
export function renderStatus(el, detail, view) {
  painted.set(el, { view, detail });
  paint(el, detail, view, Date.now() / 1000);
}

/** Take the status out of `el` (and its sentence out of `detail`): what was removed has none, and
 * the ticker must not paint the last one back. */
export function clearStatus(el, detail) {
  painted.delete(el);
  el.replaceChildren();
  if (detail) {
    detail.textContent = "";
    detail.hidden = true;
  }
}

/** Repaint every status time and every "… ago" on the page: once a second. */
export function tick() {
  const now = Date.now() / 1000;
  for (const [el, { view, detail }] of painted) {
    if (!el.isConnected) painted.delete(el);
    else paint(el, detail, view, now);
  }
  for (const el of document.querySelectorAll("[data-ago]")) {
    const text = agoText(Number(el.dataset.ago), now);
    if (el.textContent !== text) el.textContent = text;
  }
}
