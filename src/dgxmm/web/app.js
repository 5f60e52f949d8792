// dgxmm web UI: login, the two views, live state from the event stream, card actions.

import { api, EventStream, setUnauthorizedHandler, token } from "./api.js";
import * as activity from "./activity.js";
import { createCard, renderMemory, setCardError, updateCard } from "./cards.js";
import { confirmRemoval, openDeploy, openMode, showFieldError, clearErrors } from "./forms.js";

const $ = (id) => document.getElementById(id);
const deployments = new Map(); // id -> view
const names = new Map(); // id -> name, removed deployments included (for event rows)
const cards = new Map(); // id -> card element
let host = null;
let hostTimer = null;
let seenSinceOpen = new Set();
let live = false;

activity.setNameResolver((id) => names.get(id));

// --- live state ------------------------------------------------------------------------------

function say(text) {
  $("action-status").textContent = text;
}

function changedForMemory(old, view) {
  return !old || old.state !== view.state || old.mode !== view.mode || old.memory_gib !== view.memory_gib;
}

function upsert(view) {
  const old = deployments.get(view.id);
  if (view.removed) {
    deployments.delete(view.id);
    const card = cards.get(view.id);
    if (card) card.remove();
    cards.delete(view.id);
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
  }
  if (names.get(view.id) !== view.name) {
    names.set(view.id, view.name);
    activity.refreshNames();
  }
  $("deployments-empty").hidden = deployments.size > 0;
  if (view.removed || changedForMemory(old, view)) {
    renderMemory(host, [...deployments.values()]);
    refreshHostSoon();
  }
}

/**
 * A view from an API answer. While the stream is live it may already have delivered something
 * newer (e.g. the LiteLLM status right after a create), so the answer only fills gaps.
 */
function upsertAnswer(view) {
  if (!live || !deployments.has(view.id)) upsert(view);
}

async function refreshHost() {
  host = await api("host");
  renderMemory(host, [...deployments.values()]);
  showInstance(host);
}

/** Which host of a fleet this is: its instance id, as its LiteLLM entries carry it. */
function showInstance(hostView) {
  const el = $("instance");
  el.textContent = hostView && hostView.instance_id ? `Instance ${hostView.instance_id}` : "";
  el.hidden = !el.textContent;
}

function refreshHostSoon() {
  clearTimeout(hostTimer);
  hostTimer = setTimeout(() => refreshHost().catch(() => {}), 300);
}

/** After a (re)connect: drop deployments removed while the stream was down. */
async function reconcile() {
  const list = await api("deployments");
  const ids = new Set(list.map((v) => v.id));
  for (const id of [...deployments.keys()]) {
    if (!ids.has(id) && !seenSinceOpen.has(id)) upsert({ ...deployments.get(id), removed: true });
  }
  for (const view of list) if (!seenSinceOpen.has(view.id)) upsert(view);
}

function setConnection(text, state) {
  live = state === "live";
  const conn = $("conn");
  conn.textContent = text;
  conn.dataset.state = state;
}

const stream = new EventStream({
  open() {
    seenSinceOpen = new Set();
    setConnection("Live", "live");
    reconcile().catch(() => {});
    refreshHost().catch(() => {});
    activity.loadEvents().catch(() => {});
  },
  event(type, data) {
    if (type === "deployment") {
      seenSinceOpen.add(data.id);
      upsert(data);
    } else if (type === "log") {
      activity.addEvent(data);
    }
  },
  closed(delay) {
    setConnection(`Reconnecting in ${Math.round(delay / 1000)} s…`, "down");
  },
  unauthorized() {
    logout("The admin token was refused. Log in again.");
  },
});

// --- card actions ----------------------------------------------------------------------------

async function act(id, action, button) {
  const view = deployments.get(id);
  const card = cards.get(id);
  if (!view || !card) return;
  setCardError(card, "");
  if (action === "mode") {
    openMode(view, (updated) => {
      upsertAnswer(updated);
      say(updated.pending_mode === "always_on"
        ? `${updated.name}: switching to always on once it has started.`
        : `${updated.name}: mode saved.`);
    });
    return;
  }
  if (action === "remove" && !(await confirmRemoval(view.name))) return;
  button.disabled = true;
  say(`${view.name}: ${action === "remove" ? "removing" : action} requested…`);
  try {
    const path = `deployments/${encodeURIComponent(id)}`;
    if (action === "remove") {
      await api(path, { method: "DELETE" });
      upsert({ ...view, removed: true });
      say(`${view.name} removed.`);
      $("deploy-open").focus();
    } else {
      upsertAnswer(await api(`${path}/${action}`, { method: "POST" }));
      say(`${view.name}: ${action} done.`);
    }
  } catch (error) {
    setCardError(card, error.message);
    say(`${view.name}: ${action} failed.`);
  } finally {
    button.disabled = false;
  }
}

$("cards").addEventListener("click", (event) => {
  const button = event.target.closest("button[data-action]");
  if (!button) return;
  act(button.closest("[data-id]").dataset.id, button.dataset.action, button);
});

$("deploy-open").addEventListener("click", async () => {
  try {
    host = await api("host");
  } catch {
    // open with what we know; the API will answer the submit
  }
  openDeploy(host, (view) => {
    upsertAnswer(view);
    say(`${view.name} deployed${view.mode === "on_demand" ? ": its first request starts it" : ""}.`);
  });
});

$("audit-refresh").addEventListener("click", () => activity.loadAudit().catch(() => {}));

// --- views, login and logout -----------------------------------------------------------------

function route() {
  const loggedIn = Boolean(token.get());
  const view = location.hash === "#activity" ? "activity" : "deployments";
  $("login-view").hidden = loggedIn;
  $("nav").hidden = !loggedIn;
  $("logout").hidden = !loggedIn;
  $("deployments-view").hidden = !loggedIn || view !== "deployments";
  $("activity-view").hidden = !loggedIn || view !== "activity";
  for (const link of $("nav").querySelectorAll("a")) {
    if (link.dataset.view === view) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  document.title = loggedIn ? `${view === "activity" ? "Events and audit" : "Deployments"} · dgxmm` : "Log in · dgxmm";
  if (loggedIn && view === "activity") activity.loadAudit().catch(() => {});
}

function startSession() {
  route();
  refreshHost().catch(() => {});
  stream.start();
}

function logout(message = "") {
  stream.stop();
  token.clear();
  deployments.clear();
  cards.clear();
  $("cards").replaceChildren();
  setConnection("", "");
  showInstance(null);
  const form = $("login-form");
  form.reset();
  clearErrors(form);
  if (message) showFieldError(form, "token", message);
  route();
  $("login-token").focus();
}

setUnauthorizedHandler(() => logout("The admin token was refused. Log in again."));

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

if (token.get()) startSession();
else {
  route();
  $("login-token").focus();
}
