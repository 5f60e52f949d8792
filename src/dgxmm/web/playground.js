// The detail view's playground: a chat with the deployment, streamed back through the gateway
// (POST api/deployments/<id>/playground; the server adds the on-demand key), saying as it happens
// whether it queued for memory or waited for a cold start, and the tokens per second. Each message
// carries the turns before it and the system prompt; Copy as curl gives the same request as a
// caller sends it to the gateway, with the caller's key left as $DGXMM_KEY (issue 41 item 15).
// Max tokens and the temperature are checked here before sending, as the API checks them.

import { token } from "./api.js";

const form = document.getElementById("playground-form");
const status = document.getElementById("playground-status");
const answer = document.getElementById("playground-answer");
let deploymentOf = () => null;
let running = null;
const turns = document.getElementById("playground-turns");
const curlBox = document.getElementById("playground-curl");
let history = []; // the turns said so far: {role, content}, user and assistant by turns

function turnItem(role, content) {
  const li = document.createElement("li");
  li.className = `turn-${role}`;
  const who = document.createElement("span");
  who.className = "who";
  who.textContent = role === "user" ? "You:" : "Model:";
  li.append(who, content);
  return li;
}

/** The messages a send carries: the system prompt, the turns so far, then `prompt`. */
function messagesWith(prompt) {
  const system = form.elements.system.value.trim();
  return [...(system ? [{ role: "system", content: system }] : []), ...history,
    ...(prompt ? [{ role: "user", content: prompt }] : [])];
}

/** A number field's value: null when empty, undefined (with its message shown) when not allowed. */
function numberField(name, allowed, why) {
  const input = form.elements[name];
  const raw = input.value.trim();
  const ok = raw === "" || allowed(Number(raw));
  document.getElementById(input.getAttribute("aria-describedby")).textContent = ok ? "" : why(raw);
  if (ok) input.removeAttribute("aria-invalid");
  else input.setAttribute("aria-invalid", "true");
  return ok ? (raw === "" ? null : Number(raw)) : undefined;
}

/** What a send carries besides the messages: {max_tokens, temperature} as given, or null with
 * each field's message shown (both checked at once). */
function options() {
  const max = numberField("max_tokens", (v) => Number.isInteger(v) && v >= 1 && v <= 32768,
    (raw) => `${raw} is not allowed: enter a whole number of tokens from 1 to 32768.`);
  const temperature = numberField("temperature", (v) => Number.isFinite(v) && v >= 0 && v <= 2,
    (raw) => `${raw} is not allowed: enter a temperature from 0 to 2, or leave it empty for the model's default.`);
  if (max === undefined || temperature === undefined) return null;
  return { ...(max !== null ? { max_tokens: max } : {}), ...(temperature !== null ? { temperature } : {}) };
}

/** The request as a caller sends it to the gateway, streamed, the key left to the caller. */
function curlOf(view, messages, given) {
  const url = new URL(`ondemand/${encodeURIComponent(view.id)}/v1/chat/completions`, location.href).href;
  const body = { model: view.served_name, messages, stream: true, ...given };
  const quoted = `'${JSON.stringify(body, null, 2).replace(/'/g, "'\\''")}'`;
  return `curl -N ${url} \\\n  -H "Authorization: Bearer $DGXMM_KEY" \\\n  -H "Content-Type: application/json" \\\n  -d ${quoted}`;
}

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
  history = [];
  turns.replaceChildren();
  curlBox.hidden = true;
  curlBox.textContent = "";
}

document.getElementById("playground-new").addEventListener("click", () => {
  resetPlayground();
  form.elements.prompt.focus();
});

document.getElementById("playground-curl-copy").addEventListener("click", async () => {
  const view = deploymentOf();
  const given = options();
  if (!view || !given) return;
  curlBox.textContent = curlOf(view, messagesWith(form.elements.prompt.value.trim()), given);
  curlBox.hidden = false;
  try {
    await navigator.clipboard.writeText(curlBox.textContent);
    status.textContent = "Copied the request as curl (set DGXMM_KEY to a caller's key).";
  } catch {
    status.textContent = "The request as curl is below (the clipboard was not available).";
  }
});

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
  const given = options();
  if (!prompt) status.textContent = "Enter a message first.";
  if (!view || !prompt || !given) return;
  if (running) running.abort();
  const ctrl = new AbortController();
  running = ctrl;
  // The answer before is a turn of the conversation now; this message is the next one.
  if (answer.textContent && history.length && history[history.length - 1].role === "user") {
    history.push({ role: "assistant", content: answer.textContent });
    turns.append(turnItem("assistant", answer.textContent));
  } else if (history.length && history[history.length - 1].role === "user") {
    history.pop(); // it got no answer: it is sent again with this one
    turns.lastElementChild.remove();
  }
  const messages = messagesWith(prompt);
  history.push({ role: "user", content: prompt });
  turns.append(turnItem("user", prompt));
  form.elements.prompt.value = "";
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
      body: JSON.stringify({ messages, ...given }),
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
