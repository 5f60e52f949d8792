// dgxmm web UI: login, the views, live state from the event stream, an honest connection
// (banner, stale page greyed, actions disabled while disconnected), and the actions.

import { api, EventStream, setUnauthorizedHandler, token } from "./api.js";
import * as activity from "./activity.js";
import * as requests from "./requests.js";
import "./keys.js"; // the caller keys view registers itself
import { loadLog } from "./serverlog.js";
import { createCard, setCardError, updateCard } from "./cards.js";
import { showConfig } from "./configerror.js";
import * as detail from "./detail.js";
import { clearErrors, confirmRemoval, confirmStop, inflightOf, openMode, showFieldError } from "./forms.js";
import { clock, learnHost } from "./format.js";
import { offers, showOffers } from "./makeroom.js";
import { syncStopIdle, wireStopIdle } from "./stopidle.js";
import { renderMemory, renderMemoryHistory } from "./memory.js";
import { tick } from "./status.js";
import { clearRows, removeRow, upsertRow } from "./table.js";
import { applyFilters, initToolbar, layout, restorePrefs, sortNow } from "./toolbar.js";
import { openWizard, wizardHost } from "./wizard.js";
import { addView, closeViews, eventToViews, resyncViews, showView, titleOf, viewOf } from "./views.js";
import "./models.js"; // the Models view registers itself

const $ = (id) => document.getElementById(id);
const deployments = new Map(); // id -> view
const names = new Map(); // id -> name, removed deployments included (for event rows)
const cards = new Map(); // id -> card element
const pending = new Map(); // id -> name: a start or wake we asked for, until it ends
const roomOffers = new Map(); // id -> the offer shown after its start did not fit (makeroom.js)
let host = null;
let hostHistory = null;
let hostTimer = null;
let historyTimer = null;
let seenSinceOpen = new Set();
let live = false;
let everLive = false;
let startedAt = null; // host.started_at when last connected: a new one means dgxmm restarted
let retryAt = 0;

activity.setNameResolver((id) => names.get(id));
if (matchMedia("(max-width: 40rem)").matches) $("memory-history-box").open = false; // a phone: cards first
initToolbar(deployments, cards);

// --- messages --------------------------------------------------------------------------------

function say(text) {
  $("action-status").textContent = text;
  $("detail-status").textContent = text;
}

function showError(id, message) {
  if (detail.detailId() === id) $("detail-error").textContent = message;
  const card = cards.get(id);
  if (card) setCardError(card, message);
  if (!message) offerRoom(id, null);
}

function offerRoom(id, offer) {
  if (offer) roomOffers.set(id, offer);
  else roomOffers.delete(id);
  const card = cards.get(id);
  if (card) {
    showOffers(card.querySelector('[data-field="offer"]'), offer);
    syncDisabled(card);
  }
}

/** A start refused for memory: name the idle models holding it and offer to stop them. */
async function offerAfterRefusal(view, modeChange = null) {
  await refreshHost().catch(() => {});
  if (!host) return;
  const then = modeChange ? "switch to always on" : "start";
  const offer = offers(view, [...deployments.values()], view.memory_gib - host.memory.free_gib, then);
  offerRoom(view.id, offer && { ...offer, modeChange });
  const first = cards.get(view.id) && cards.get(view.id).querySelector('[data-field="offer"] button');
  if (first) first.focus(); // the dialog closed: the offer is what to do next
}

/** Stop the offered models (one after the other, each answered once stopped), then start (or
 * switch the mode the offer was made for, which starts it). */
async function stopThenStart(view, victims, modeChange = null) {
  for (const victim of victims) {
    say(`${victim.name}: stop requested…`);
    upsertAnswer(await api(`deployments/${encodeURIComponent(victim.id)}/stop`, { method: "POST" }));
  }
  pending.set(view.id, view.name);
  const path = `deployments/${encodeURIComponent(view.id)}`;
  upsertAnswer(modeChange
    ? await api(`${path}/mode`, { method: "PATCH", body: modeChange })
    : await api(`${path}/start`, { method: "POST" }));
  const next = modeChange ? "it becomes always on once it is ready" : "loading…";
  say(`${view.name}: stopped ${victims.map((v) => v.name).join(", ")}; start requested; ${next}`);
}

// --- live state ------------------------------------------------------------------------------

function changedForMemory(old, view) {
  return !old || old.state !== view.state || old.mode !== view.mode || old.memory_gib !== view.memory_gib
    || (old.status || {}).code !== (view.status || {}).code || String(old.gpu_ids) !== String(view.gpu_ids);
}

function upsert(view) {
  const old = deployments.get(view.id);
  if (view.removed) {
    deployments.delete(view.id);
    if (cards.get(view.id)) cards.get(view.id).remove();
    cards.delete(view.id);
    removeRow(view.id);
  } else {
    deployments.set(view.id, view);
    let card = cards.get(view.id);
    if (!card) {
      card = createCard(view);
      cards.set(view.id, card);
      $("cards").append(card);
    } else {
      updateCard(card, view);
    }
    syncDisabled(upsertRow(view));
    syncDisabled(card);
  }
  syncStopIdle();
  detail.updateDetail(view);
  if (names.get(view.id) !== view.name) {
    names.set(view.id, view.name);
    activity.refreshNames();
  }
  showEmpty();
  applyFilters();
  if (layout() === "table" && (!old || view.removed || old.status?.code !== view.status?.code)) sortNow();
  if (view.removed || changedForMemory(old, view)) {
    renderMemory(host, [...deployments.values()]);
    refreshHostSoon();
  }
}

/** A view from an API answer: while the stream is live it may already have delivered newer. */
function upsertAnswer(view) {
  if (!live || !deployments.has(view.id)) upsert(view);
}

async function refreshHost() {
  host = await api("host");
  learnHost(host);
  renderMemory(host, [...deployments.values()]);
  showInstance(host);
  document.body.dataset.role = host.role === "viewer" ? "viewer" : "admin"; // (views.css hides what a viewer may not do)
  wizardHost(host, [...deployments.values()]);
  detail.detailHost(host);
  showConfig(host.config);
  return host;
}

/** Which host of a fleet this is: its instance id, as its LiteLLM entries carry it. */
function showInstance(hostView) {
  const el = $("instance");
  el.textContent = hostView && hostView.instance_id ? `Instance ${hostView.instance_id}` : "";
  el.hidden = !el.textContent;
}

async function refreshHostHistory() {
  hostHistory = await api("host/history");
  renderMemoryHistory(hostHistory, [...deployments.values()]);
}

function refreshHostSoon() {
  clearTimeout(hostTimer);
  hostTimer = setTimeout(() => {
    refreshHost().catch(() => {});
    refreshHostHistory().catch(() => {});
  }, 600);
}

/** "No deployments yet" while there are none. */
function showEmpty() {
  $("deployments-empty").hidden = deployments.size > 0;
}

/** After a (re)connect: drop deployments removed while the stream was down. */
async function reconcile() {
  const list = await api("deployments");
  const ids = new Set(list.map((v) => v.id));
  for (const id of [...deployments.keys()]) {
    if (!ids.has(id) && !seenSinceOpen.has(id)) upsert({ ...deployments.get(id), removed: true });
  }
  for (const view of list) if (!seenSinceOpen.has(view.id)) upsert(view);
  showEmpty(); // a fresh host has nothing to upsert: say what to do first
  const shown = detail.detailId();
  if (shown && !deployments.has(shown)) detail.updateDetail({ id: shown, removed: true });
}

// --- connection honesty ----------------------------------------------------------------------

/** While disconnected every action waits: what the page shows may be stale. */
function syncDisabled(root = document) {
  for (const b of root.querySelectorAll("[data-needs-live]")) b.disabled = !live || Boolean(b.dataset.busy);
  if (root === document) syncStopIdle();
}

function setConnection(state) {
  live = state === "live";
  document.body.dataset.conn = state;
  const conn = $("conn");
  conn.dataset.state = state;
  conn.textContent = state === "live" ? "Live" : state === "down" ? "Disconnected" : "";
  $("conn-banner").hidden = state !== "down";
  syncDisabled();
  showCountdown();
}

function showCountdown() {
  const left = Math.ceil((retryAt - Date.now()) / 1000);
  $("conn-countdown").textContent = left > 0 ? `Reconnecting in ${left} s.` : "Reconnecting…";
}

function notice(text) {
  const box = $("conn-notice");
  box.textContent = text;
  box.hidden = false;
  clearTimeout(box.timer);
  box.timer = setTimeout(() => { box.hidden = true; }, 15000);
}

async function resync(wasDown) {
  const previous = startedAt;
  const now = await refreshHost();
  startedAt = now.started_at;
  if (wasDown) {
    const restarted = previous !== null && now.started_at !== previous;
    notice(restarted ? `Reconnected: dgxmm restarted at ${clock(now.started_at)}.` : "Reconnected.");
    // Errors from before the drop describe a past that may no longer be true.
    for (const card of cards.values()) setCardError(card, "");
    $("detail-error").textContent = "";
    say("");
  }
  await reconcile();
  refreshHostHistory().catch(() => {});
  activity.loadEvents().catch(() => {});
  detail.reloadDetail();
  resyncViews();
}

const stream = new EventStream({
  open() {
    const wasDown = everLive && !live;
    everLive = true;
    seenSinceOpen = new Set();
    setConnection("live");
    resync(wasDown).catch(() => {});
  },
  event(type, data) {
    if (type === "deployment") {
      seenSinceOpen.add(data.id);
      upsert(data);
    } else if (type === "memory" || type === "prefetch") {
      const known = deployments.get(data.id);
      if (known) upsert({ ...known, ...data });
    } else if (type === "log") {
      activity.addEvent(data);
      detail.detailEvent(data);
      settlePending(data);
    } else if (type === "config") {
      showConfig(data);
    }
    eventToViews(type, data);
  },
  closed(delay) {
    retryAt = Date.now() + delay;
    setConnection("down");
  },
  unauthorized() {
    logout("The admin token was refused. Log in again.");
  },
});

$("conn-retry").addEventListener("click", () => stream.retryNow());

// --- actions ---------------------------------------------------------------------------------

/** "Ready after 6.6 s" or "Failed: …" for a start or wake we asked for: say how it ended. */
function settlePending(row) {
  const name = pending.get(row.deployment_id);
  if (!name) return;
  if (row.text.startsWith("Ready after")) say(`${name}: ready after ${row.text.slice(12)}.`);
  else if (row.text.startsWith("Failed: ")) say(`${name}: start failed: ${row.text.slice(8)}.`);
  else return;
  pending.delete(row.deployment_id);
}

const DONE = { stop: "stopped", sleep: "is asleep" };

async function act(id, action, button) {
  const view = deployments.get(id);
  if (!view) return;
  const offer = roomOffers.get(id); // (read before the error and its offers are cleared)
  showError(id, "");
  if (action === "mode") {
    openMode(view, (updated) => {
      upsertAnswer(updated);
      if (updated.pending_mode === "always_on") pending.set(id, updated.name);
      say(updated.pending_mode === "always_on"
        ? `${updated.name}: start requested; it becomes always on once it is ready.`
        : `${updated.name}: mode saved.`);
    }, (error, modeChange) => {
      showError(id, error.message);
      say(`${view.name}: not switched to always on: memory is short.`);
      offerAfterRefusal(view, modeChange);
    });
    return;
  }
  if (action === "edit" || action === "duplicate") {
    openWizard(host, [...deployments.values()], action === "edit" ? { edit: view } : { copy: view }, deployed);
    return;
  }
  if (action === "remove" && !(await confirmRemoval(view.name))) return;
  if (action === "stop" && !(await confirmStop(view))) return;
  const ended = action === "stop" ? inflightOf(view) : 0; // what the confirmation said it ends
  if ((action === "stop-some" || action === "stop-all") && !offer) return;
  button.dataset.busy = "1";
  button.disabled = true;
  const verb = { start: "start", wake: "wake", stop: "stop", sleep: "sleep", remove: "removal" }[action] || "start";
  say(`${view.name}: ${verb} requested…`);
  try {
    const path = `deployments/${encodeURIComponent(id)}`;
    if (offer && (action === "stop-some" || action === "stop-all")) {
      await stopThenStart(view, action === "stop-some" ? offer.some : offer.all, offer.modeChange);
    } else if (action === "remove") {
      await api(path, { method: "DELETE" });
      upsert({ ...view, removed: true });
      say(`${view.name} removed.`);
      if (detail.detailId() === id) location.hash = "#deployments";
      $("deploy-open").focus();
    } else {
      if (action === "start" || action === "wake") pending.set(id, view.name);
      upsertAnswer(await api(`${path}/${action}`, { method: "POST" }));
      const endedText = ended ? `; it ended ${ended === 1 ? "1 request" : `${ended} requests`} in flight` : "";
      say(DONE[action] ? `${view.name} ${DONE[action]}${endedText}.` : `${view.name}: ${verb} requested; loading…`);
    }
  } catch (error) {
    pending.delete(id);
    const message = error.status === 404 ? `${view.name} no longer exists.` : error.message;
    showError(id, message);
    say(`${view.name}: ${verb} failed.`);
    if (error.code === "insufficient_memory" && (action === "start" || action === "wake")) await offerAfterRefusal(view);
  } finally {
    delete button.dataset.busy;
    syncDisabled();
  }
}

for (const box of [$("cards"), $("dep-rows"), $("detail-actions")]) {
  box.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-action]");
    if (!button || button.disabled) return;
    const id = box === $("detail-actions") ? detail.detailId() : button.closest("[data-id]").dataset.id;
    act(id, button.dataset.action, button);
  });
}

wireStopIdle({ views: () => [...deployments.values()], live: () => live, say, upsertAnswer });

function deployed(view, kind) {
  upsertAnswer(view);
  if (kind === "changed") say(`${view.name}: settings saved.`);
  else if (view.mode === "on_demand" && view.status && view.status.never_fits) {
    say(`${view.name} deployed, but it is too big to ever fit here: its requests are refused (does_not_fit).`);
  } else if (view.mode === "on_demand") say(`${view.name} deployed: its first request starts it.`);
  else {
    pending.set(view.id, view.name);
    say(`${view.name} deployed: start requested; loading…`);
  }
}

$("deploy-open").addEventListener("click", async () => {
  await refreshHost().catch(() => {}); // open with what we know; the API answers the submit
  openWizard(host, [...deployments.values()], {}, deployed);
});

$("audit-refresh").addEventListener("click", () => activity.loadAudit().catch(() => {}));

// --- views, login and logout -----------------------------------------------------------------

function route() {
  const loggedIn = Boolean(token.get());
  const hash = location.hash;
  const detailMatch = /^#deployment\/(.+)$/.exec(hash);
  const view = viewOf(hash) || (detailMatch ? "detail" : "deployments");
  $("login-view").hidden = loggedIn;
  $("nav").hidden = !loggedIn;
  $("logout").hidden = !loggedIn;
  $("deployments-view").hidden = !loggedIn || view !== "deployments";
  $("detail-view").hidden = !loggedIn || view !== "detail";
  for (const link of $("nav").querySelectorAll("a")) {
    const current = link.dataset.view === view || (view === "detail" && link.dataset.view === "deployments");
    if (current) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.title = !loggedIn ? "Log in · dgxmm" : `${titleOf(view) || "Deployments"} · dgxmm`;
  showView(view, loggedIn);
  if (loggedIn && view === "detail") {
    const id = decodeURIComponent(detailMatch[1]);
    detail.openDetail(id, deployments.get(id), host, () => logout("The admin token was refused. Log in again."));
  } else {
    detail.closeDetail();
  }
}

addView("requests", { title: "Requests", open: requests.openRequests, close: requests.closeRequests });
addView("activity", {
  title: "Events and audit",
  open() {
    activity.loadAudit().catch(() => {});
    loadLog().catch(() => {});
  },
});

function startSession() {
  route();
  restorePrefs();
  // The host first: what it says of engine kinds and bounds is what cards and forms show.
  refreshHost().then((h) => { startedAt = startedAt ?? h.started_at; }).catch(() => {}).finally(() => stream.start());
  clearInterval(historyTimer);
  historyTimer = setInterval(() => refreshHostHistory().catch(() => {}), 30000);
}

function logout(message = "") {
  stream.stop();
  closeViews();
  token.clear();
  delete document.body.dataset.role;
  detail.closeDetail();
  deployments.clear();
  cards.clear();
  clearRows();
  $("cards").replaceChildren();
  everLive = false;
  startedAt = null;
  clearInterval(historyTimer);
  setConnection("");
  showInstance(null);
  showConfig(null);
  const form = $("login-form");
  form.reset();
  clearErrors(form);
  if (message) showFieldError(form, "token", message);
  route();
  $("login-token").focus();
}

setUnauthorizedHandler(() => logout("The admin token was refused. Log in again."));
requests.setUnauthorizedHandler(() => logout("The admin token was refused. Log in again."));

$("logout").addEventListener("click", () => logout());

$("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = event.currentTarget;
  clearErrors(form);
  const value = form.elements.token.value.trim();
  if (!value) {
    showFieldError(form, "token", "Enter the admin token.").focus();
    return;
  }
  token.set(value);
  try {
    host = await api("host", { quiet401: true });
    learnHost(host);
  } catch (error) {
    token.clear();
    const message = error.status === 401 ? "This token was refused." : error.message;
    showFieldError(form, "token", message).focus();
    return;
  }
  form.reset();
  startSession();
  $("main").focus();
});

window.addEventListener("hashchange", () => {
  route();
  $("main").focus();
});

setInterval(() => {
  tick();
  if (!live && everLive) showCountdown();
}, 1000);

if (token.get()) startSession();
else {
  route();
  $("login-token").focus();
}
