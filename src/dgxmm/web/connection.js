// An honest connection: while the event stream is down the page says so (the banner with its
// countdown, the page greyed as stale) and every action waits, as what it shows may be stale.

import { syncStopIdle } from "./stopidle.js";

const $ = (id) => document.getElementById(id);
let live = false;
let retryAt = 0;

/** Whether the event stream is connected now. */
export function isLive() {
  return live;
}

/** While disconnected every action waits: what the page shows may be stale. */
export function syncDisabled(root = document) {
  for (const b of root.querySelectorAll("[data-needs-live]")) b.disabled = !live || Boolean(b.dataset.busy);
  if (root === document) syncStopIdle();
}

export function setConnection(state) {
  live = state === "live";
  document.body.dataset.conn = state;
  const conn = $("conn");
  conn.dataset.state = state;
  conn.textContent = state === "live" ? "Live" : state === "down" ? "Disconnected" : "";
  $("conn-banner").hidden = state !== "down";
  syncDisabled();
  showCountdown();
}

/** The stream ended: disconnected, and tried again after `delay` ms. */
export function connectionLost(delay) {
  retryAt = Date.now() + delay;
  setConnection("down");
}

export function showCountdown() {
  const left = Math.ceil((retryAt - Date.now()) / 1000);
  $("conn-countdown").textContent = left > 0 ? `Reconnecting in ${left} s.` : "Reconnecting…";
}

export function notice(text) {
  const box = $("conn-notice");
  box.textContent = text;
  box.hidden = false;
  clearTimeout(box.timer);
  box.timer = setTimeout(() => { box.hidden = true; }, 15000);
}
