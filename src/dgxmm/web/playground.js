// The detail view's playground: one chat message to the deployment, streamed back through the
// gateway (POST api/deployments/<id>/playground; the server adds the on-demand key), saying as it
// happens whether it queued for memory or waited for a cold start, and the tokens per second.

import { token } from "./api.js";

const form = document.getElementById("playground-form");
const status = document.getElementById("playground-status");
const answer = document.getElementById("playground-answer");
let deploymentOf = () => null;
let running = null;

/** `current()` gives the deployment the detail view shows (its view), or null. */
export function setDeployment(current) {
  deploymentOf = current;
}

/** The detail view closed or moved to another deployment: stop what runs, forget what was said. */
export function resetPlayground() {
  if (running) running.abort();
  running = null;
  status.textContent = "";
  answer.textContent = "";
}

function seconds(ms) {
  return `${(ms / 1000).toFixed(1)} s`;
}

/** Reads the SSE answer as it comes; calls `chunk(data)` for each JSON event. */
async function readEvents(resp, chunk) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let carry = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    carry += decoder.decode(value, { stream: true });
    const lines = carry.split("\n");
    carry = lines.pop();
    for (const line of lines) {
      if (line.startsWith("data: {")) chunk(JSON.parse(line.slice(6)));
    }
  }
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const view = deploymentOf();
  const prompt = form.elements.prompt.value.trim();
  if (!view || !prompt) return;
  if (running) running.abort();
  const ctrl = new AbortController();
  running = ctrl;
  answer.textContent = "";
  const cold = !["ready", "asleep"].includes(view.state);
  status.textContent = cold ? `Sent: ${view.name} is not running, its engine starts for this message…` : "Sent…";
  const began = performance.now();
  let first = null;
  let usage = null;
  try {
    const resp = await fetch(`api/deployments/${encodeURIComponent(view.id)}/playground`, {
      method: "POST", signal: ctrl.signal, cache: "no-store",
      headers: { Authorization: `Bearer ${token.get()}`, "Content-Type": "application/json" },
      body: JSON.stringify({ messages: [{ role: "user", content: prompt }], max_tokens: 256 }),
    });
    if (!resp.ok) {
      const data = await resp.json().catch(() => null);
      status.textContent = `Not sent: ${(data && data.error && data.error.message) || `HTTP ${resp.status}`}`;
      return;
    }
    await readEvents(resp, (data) => {
      if (data.error) {
        status.textContent = `Failed: ${data.error.message}`;
        return;
      }
      if (data.id === "ondemand-queued") {
        status.textContent = "Queued: it waits for memory (another model is stopped, or its turn comes)…";
        return;
      }
      if (data.usage) usage = data.usage;
      const text = data.choices && data.choices[0] && data.choices[0].delta && data.choices[0].delta.content;
      if (text) {
        if (first === null) {
          first = performance.now();
          status.textContent = `First token after ${seconds(first - began)}${cold ? " (a cold start)" : ""}; streaming…`;
        }
        answer.textContent += text;
      }
    });
    const end = performance.now();
    if (first !== null) {
      const made = usage && usage.completion_tokens;
      const speed = made && end > first ? ` at ${(made / ((end - first) / 1000)).toFixed(1)} tokens/s` : "";
      status.textContent = `First token after ${seconds(first - began)}${cold ? " (a cold start)" : ""}; `
        + `${made ? `${made} tokens` : "answered"} in ${seconds(end - began)}${speed}.`;
    } else if (!status.textContent.startsWith("Failed")) {
      status.textContent = "The model answered nothing.";
    }
  } catch (err) {
    if (err.name !== "AbortError") status.textContent = `Not sent: dgxmm did not answer (${err.message}).`;
  } finally {
    if (running === ctrl) running = null;
  }
});
