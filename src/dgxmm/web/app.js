// dgxmm web UI: login, the views, and live state from the event stream, with the connection's
// honesty in connection.js and the actions on deployments in actions.js.

import { api, EventStream, setUnauthorizedHandler, token } from "./api.js";
import * as activity from "./activity.js";
import { say, settlePending, wireActions } from "./actions.js";
import * as requests from "./requests.js";
import "./keys.js"; // the caller keys view registers itself
import { loadLog } from "./serverlog.js";
import { createCard, setCardError, updateCard } from "./cards.js";
import { showConfig } from "./configerror.js";
import { connectionLost, isLive, notice, setConnection, showCountdown, syncDisabled } from "./connection.js";
import * as detail from "./detail.js";
import { clearErrors, showFieldError } from "./forms.js";
import { clock, learnHost } from "./format.js";
import { syncStopIdle, wireStopIdle } from "./stopidle.js";
import { renderMemory, renderMemoryHistory } from "./memory.js";
import { tick } from "./status.js";
import { setTitle, showProblems } from "./problems.js";
import { clearRows, removeRow, upsertRow } from "./table.js";
import { applyFilters, initToolbar, restorePrefs, sortNow } from "./toolbar.js";
import { wizardHost } from "./wizard.js";
import { addView, closeViews, eventToViews, resyncViews, showView, titleOf, viewOf } from "./views.js";
import "./models.js"; // the Models view registers itself

const $ = (id) => document.getElementById(id);
const deployments = new Map(); // id -> view
const names = new Map(); // id -> name, removed deployments included (for event rows)
const cards = new Map(); // id -> card element
let host = null;
let hostHistory = null;
let hostTimer = null;
let historyTimer = null;
let seenSinceOpen = new Set();
let everLive = false;
let startedAt = null; // host.started_at when last connected: a new one means dgxmm restarted

activity.setNameResolver((id) => names.get(id));
if (matchMedia("(max-width: 40rem)").matches) $("memory-history-box").open = false; // a phone: cards first
initToolbar(deployments, cards);

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
  showProblems(deployments.values());
  applyFilters();
  if (!old || view.removed || old.status?.code !== view.status?.code) sortNow();
  if (view.removed || changedForMemory(old, view)) {
    renderMemory(host, [...deployments.values()]);
    refreshHostSoon();
  }
}

/** A view from an API answer: while the stream is live it may already have delivered newer. */
function upsertAnswer(view) {
  if (!isLive() || !deployments.has(view.id)) upsert(view);
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

// --- the event stream ------------------------------------------------------------------------

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
    const wasDown = everLive && !isLive();
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
    connectionLost(delay);
  },
  unauthorized() {
    logout("The token was refused. Log in again.");
  },
});

$("conn-retry").addEventListener("click", () => stream.retryNow());

// --- actions ---------------------------------------------------------------------------------

wireActions({ deployments, cards, host: () => host, refreshHost, upsert, upsertAnswer });
wireStopIdle({ views: () => [...deployments.values()], live: isLive, say, upsertAnswer });

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
  setTitle(!loggedIn ? "Log in · dgxmm" : `${titleOf(view) || "Deployments"} · dgxmm`);
  showView(view, loggedIn);
  if (loggedIn && view === "detail") {
    const id = decodeURIComponent(detailMatch[1]);
    detail.openDetail(id, deployments.get(id), host, () => logout("The token was refused. Log in again."));
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
  showProblems([]);
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

setUnauthorizedHandler(() => logout("The token was refused. Log in again."));
requests.setUnauthorizedHandler(() => logout("The token was refused. Log in again."));

$("logout").addEventListener("click", () => logout());

$("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = event.currentTarget;
  clearErrors(form);
  const value = form.elements.token.value.trim();
  if (!value) {
    showFieldError(form, "token", "Enter the admin or a viewer token.").focus();
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
  if (!isLive() && everLive) showCountdown();
}, 1000);

if (token.get()) startSession();
else {
  route();
  $("login-token").focus();
}
