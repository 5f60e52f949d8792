// "Stop all idle" beside the memory heading (issue 41 item 13): the idle (or asleep) on-demand
// models, least recently used first, one after the other. Each is read again just before its
// stop, and one that took a request meanwhile is left running; the API's Stop is composed, so a
// request arriving between that read and the stop ends with the engine, as with any Stop.

import { api } from "./api.js";
import { idleHolders } from "./makeroom.js";

const button = document.getElementById("stop-idle");
let app = null; // { views, live, say, upsertAnswer } from app.js

/** The button's count and whether it can be pressed now. */
export function syncStopIdle() {
  if (!app) return;
  const idle = idleHolders(app.views(), null);
  button.textContent = idle.length ? `Stop all idle (${idle.length})` : "Stop all idle";
  button.disabled = !app.live() || !idle.length || Boolean(button.dataset.busy);
}

async function stopAllIdle() {
  const idle = idleHolders(app.views(), null);
  if (!idle.length) return;
  button.dataset.busy = "1";
  syncStopIdle();
  const stopped = [];
  const kept = [];
  try {
    for (const view of idle) {
      const path = `deployments/${encodeURIComponent(view.id)}`;
      const now = await api(path).catch(() => null); // gone meanwhile: nothing to stop
      if (!now || idleHolders([now], null).length === 0) {
        if (now) kept.push(now.name);
        continue;
      }
      app.say(`${now.name}: stop requested…`);
      app.upsertAnswer(await api(`${path}/stop`, { method: "POST" }));
      stopped.push(now.name);
    }
    const left = kept.length ? ` ${kept.join(", ")} took a request meanwhile and keeps running.` : "";
    app.say(stopped.length ? `Stopped ${stopped.length} idle: ${stopped.join(", ")}.${left}` : `Nothing stopped.${left}`);
  } catch (error) {
    app.say(`Stop all idle: ${error.message}${stopped.length ? ` (stopped ${stopped.join(", ")})` : ""}`);
  } finally {
    delete button.dataset.busy;
    syncStopIdle();
  }
}

export function wireStopIdle(hooks) {
  app = hooks;
  button.addEventListener("click", () => stopAllIdle());
  syncStopIdle();
}
