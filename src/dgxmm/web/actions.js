// The actions on a deployment, from its card, its table row or its detail view (start, wake,
// stop, sleep, remove, mode, edit, duplicate) and Deploy: each asked of the API and said in the
// status line, a start refused for memory answered with the idle models to stop for it
// (makeroom.js), and a start or wake we asked for followed until it is ready or failed.

import { api } from "./api.js";
import { setCardError } from "./cards.js";
import { syncDisabled } from "./connection.js";
import * as detail from "./detail.js";
import { confirmRemoval, confirmStop, inflightOf, openMode } from "./forms.js";
import { offers, showOffers } from "./makeroom.js";
import { openWizard } from "./wizard.js";

const $ = (id) => document.getElementById(id);
const pending = new Map(); // id -> name: a start or wake we asked for, until it ends
const roomOffers = new Map(); // id -> the offer shown after its start did not fit (makeroom.js)
let app = null; // { deployments, cards, host, refreshHost, upsert, upsertAnswer } from app.js

/** The status line of the deployments and of the detail view. */
export function say(text) {
  $("action-status").textContent = text;
  $("detail-status").textContent = text;
}

function showError(id, message) {
  if (detail.detailId() === id) $("detail-error").textContent = message;
  const card = app.cards.get(id);
  if (card) setCardError(card, message);
  if (!message) offerRoom(id, null);
}

function offerRoom(id, offer) {
  if (offer) roomOffers.set(id, offer);
  else roomOffers.delete(id);
  const card = app.cards.get(id);
  if (card) {
    showOffers(card.querySelector('[data-field="offer"]'), offer);
    syncDisabled(card);
  }
  if (detail.detailId() === id) { // the same offer where the start was pressed in the detail view
    showOffers($("detail-offer"), offer);
    syncDisabled($("detail-offer"));
  }
}

/** A start refused for memory: name the idle models holding it and offer to stop them. */
async function offerAfterRefusal(view, modeChange = null) {
  await app.refreshHost().catch(() => {});
  const host = app.host();
  if (!host) return;
  const then = modeChange ? "switch to always on" : "start";
  const offer = offers(view, [...app.deployments.values()], view.memory_gib - host.memory.free_gib, then);
  offerRoom(view.id, offer && { ...offer, modeChange });
  const card = app.cards.get(view.id);
  const box = detail.detailId() === view.id ? $("detail-offer") : card && card.querySelector('[data-field="offer"]');
  const first = box && box.querySelector("button");
  if (first) first.focus(); // the dialog closed, or the start was refused: the offer is what to do next
}

/** Stop the offered models (one after the other, each answered once stopped), then start (or
 * switch the mode the offer was made for, which starts it). */
async function stopThenStart(view, victims, modeChange = null) {
  for (const victim of victims) {
    say(`${victim.name}: stop requested…`);
    app.upsertAnswer(await api(`deployments/${encodeURIComponent(victim.id)}/stop`, { method: "POST" }));
  }
  pending.set(view.id, view.name);
  const path = `deployments/${encodeURIComponent(view.id)}`;
  app.upsertAnswer(modeChange
    ? await api(`${path}/mode`, { method: "PATCH", body: modeChange })
    : await api(`${path}/start`, { method: "POST" }));
  const next = modeChange ? "it becomes always on once it is ready" : "loading…";
  say(`${view.name}: stopped ${victims.map((v) => v.name).join(", ")}; start requested; ${next}`);
}

/** "Ready after 6.6 s" or "Failed: …" for a start or wake we asked for: say how it ended. */
export function settlePending(row) {
  const name = pending.get(row.deployment_id);
  if (!name) return;
  if (row.text.startsWith("Ready after")) say(`${name}: ready after ${row.text.slice(12)}.`);
  else if (row.text.startsWith("Failed: ")) say(`${name}: start failed: ${row.text.slice(8)}.`);
  else return;
  pending.delete(row.deployment_id);
}

const DONE = { stop: "stopped", sleep: "is asleep" };

/** A start or wake refused for memory failed nothing: nothing was started, and a model queued for
 * memory still starts for its waiting requests once there is room. */
function notNow(view, action) {
  const queued = view.status && view.status.code === "queued";
  return `${view.name}: not ${action === "wake" ? "woken" : "started"} now: memory is short`
    + (queued ? "; it starts for its waiting requests once there is room." : ".");
}

async function act(id, action, button) {
  const view = app.deployments.get(id);
  if (!view) return;
  const offer = roomOffers.get(id); // (read before the error and its offers are cleared)
  showError(id, "");
  if (action === "mode") {
    openMode(view, (updated) => {
      app.upsertAnswer(updated);
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
    openWizard(app.host(), [...app.deployments.values()], action === "edit" ? { edit: view } : { copy: view }, deployed);
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
      app.upsert({ ...view, removed: true });
      say(`${view.name} removed.`);
      if (detail.detailId() === id) location.hash = "#deployments";
      $("deploy-open").focus();
    } else {
      if (action === "start" || action === "wake") pending.set(id, view.name);
      app.upsertAnswer(await api(`${path}/${action}`, { method: "POST" }));
      const endedText = ended ? `; it ended ${ended === 1 ? "1 request" : `${ended} requests`} in flight` : "";
      say(DONE[action] ? `${view.name} ${DONE[action]}${endedText}.` : `${view.name}: ${verb} requested; loading…`);
    }
  } catch (error) {
    pending.delete(id);
    const message = error.status === 404 ? `${view.name} no longer exists.` : error.message;
    showError(id, message);
    if (error.code === "insufficient_memory" && (action === "start" || action === "wake")) {
      say(notNow(view, action));
      await offerAfterRefusal(view);
    } else {
      say(`${view.name}: ${verb} failed.`);
    }
  } finally {
    delete button.dataset.busy;
    syncDisabled();
  }
}

function deployed(view, kind) {
  app.upsertAnswer(view);
  if (kind === "changed") say(`${view.name}: settings saved.`);
  else if (view.mode === "on_demand" && view.status && view.status.never_fits) {
    say(`${view.name} deployed, but it is too big to ever fit here: its requests are refused (does_not_fit).`);
  } else if (view.mode === "on_demand") say(`${view.name} deployed: its first request starts it.`);
  else {
    pending.set(view.id, view.name);
    say(`${view.name} deployed: start requested; loading…`);
  }
}

/** The buttons answered here; `hooks`: what app.js holds of the deployments and the host. */
export function wireActions(hooks) {
  app = hooks;
  for (const box of [$("cards"), $("dep-rows"), $("detail-actions"), $("detail-offer")]) {
    const inDetail = box.id.startsWith("detail-");
    box.addEventListener("click", (event) => {
      const button = event.target.closest("button[data-action]");
      if (!button || button.disabled) return;
      const id = inDetail ? detail.detailId() : button.closest("[data-id]").dataset.id;
      act(id, button.dataset.action, button);
    });
  }
  $("deploy-open").addEventListener("click", async () => {
    await app.refreshHost().catch(() => {}); // open with what we know; the API answers the submit
    openWizard(app.host(), [...app.deployments.values()], {}, deployed);
  });
}
