// Deployment cards and the memory bar. Cards are updated in place, so a live update never
// moves keyboard focus or rebuilds a button the user is about to press.

import {
  ENGINE_LABELS, HOLDS_MEMORY, KIND_LABELS, LITELLM_LABELS, PHASE_LABELS, STATE_LABELS,
  gib, memoryKind, modeText, timeElement,
} from "./format.js";

const template = document.getElementById("card-template");

function field(card, name) {
  return card.querySelector(`[data-field="${name}"]`);
}

export function createCard(view) {
  const card = template.content.firstElementChild.cloneNode(true);
  card.dataset.id = view.id;
  const title = field(card, "name");
  title.id = `dep-${view.id}-name`;
  card.querySelector("article").setAttribute("aria-labelledby", title.id);
  for (const button of card.querySelectorAll("button[data-action]")) {
    button.setAttribute("aria-describedby", title.id);
  }
  updateCard(card, view);
  return card;
}

function setBadge(el, kind, value, label) {
  el.hidden = !label;
  el.textContent = label || "";
  el.className = `badge badge-${kind}-${value || "none"}${kind === "pending" ? " badge-pending" : ""}`;
  el.dataset[kind] = value || "";
}

export function updateCard(card, view) {
  field(card, "name").textContent = view.name;
  setBadge(field(card, "state"), "state", view.state, STATE_LABELS[view.state] || view.state);
  const od = view.ondemand;
  const phase = od && od.phase !== "failed" ? od.phase : "";
  setBadge(field(card, "phase"), "phase", phase, phase ? PHASE_LABELS[phase] || phase : "");
  const pending = view.pending_mode === "always_on" ? "always_on" : "";
  setBadge(field(card, "pending"), "pending", pending, pending ? "Switching to always on" : "");

  field(card, "served_name").textContent = view.served_name;
  field(card, "engine").textContent = ENGINE_LABELS[view.engine] || view.engine;
  const limit = view.memory_limit;  // the flag a vLLM engine is launched with (docs/engines.md)
  field(card, "memory").textContent = gib(view.memory_gib) + (limit ? ` (${limit.flag} ${limit.value})` : "");
  field(card, "mode").textContent = modeText(view);
  for (const row of card.querySelectorAll("[data-ondemand]")) row.hidden = !od;
  if (od) {
    field(card, "inflight").textContent = String(od.inflight);
    field(card, "queued").textContent = String(od.queued);
    const last = field(card, "last_request");
    last.replaceChildren(od.last_request_at ? timeElement(od.last_request_at) : "none yet");
  }
  const lite = view.litellm || { status: "disabled" };
  card.querySelector("[data-litellm]").hidden = lite.status === "disabled";
  field(card, "litellm").textContent =
    (LITELLM_LABELS[lite.status] || lite.status) + (lite.error ? ` (${lite.error})` : "");

  const reason = field(card, "reason");
  const showReason = view.state === "failed" && view.state_reason;
  reason.hidden = !showReason;
  reason.textContent = showReason ? view.state_reason : "";

  const s = view.state;
  const buttons = {};
  for (const b of card.querySelectorAll("button[data-action]")) buttons[b.dataset.action] = b;
  buttons.start.hidden = !(s === "stopped" || s === "failed");
  buttons.stop.hidden = s === "stopped" || s === "stopping";
  buttons.sleep.hidden = !(view.sleep_mode && s === "ready");
  buttons.wake.hidden = !(view.sleep_mode && s === "asleep");
  buttons.mode.hidden = Boolean(view.role && view.role !== "model");
  card.classList.toggle("is-failed", s === "failed");
}

export function setCardError(card, message) {
  const el = field(card, "error");
  el.textContent = message || "";
  el.hidden = !message;
}

/**
 * The memory bar: the host's usable memory, one segment for each deployment that holds memory
 * (starting, ready, asleep or stopping), always-on and system ones first, then what is free.
 */
export function renderMemory(host, views) {
  const bar = document.getElementById("memory-bar");
  const legend = document.getElementById("memory-legend");
  const summary = document.getElementById("memory-summary");
  if (!host) return;
  const mem = host.memory;
  const order = { system: 0, always: 1, ondemand: 2 };
  const holding = views
    .filter((v) => HOLDS_MEMORY.has(v.state))
    .sort((a, b) => order[memoryKind(a)] - order[memoryKind(b)] || a.name.localeCompare(b.name));
  const held = holding.reduce((sum, v) => sum + v.memory_gib, 0);
  const fixed = holding.filter((v) => memoryKind(v) !== "ondemand").reduce((s, v) => s + v.memory_gib, 0);
  const total = mem.usable_gib;
  const free = Math.max(0, total - held);
  // Measured sources (meminfo, nvml) may see memory used outside dgxmm.
  const other = mem.source === "declared" ? 0 : Math.max(0, Math.min(free, free - mem.free_gib));
  const scale = Math.max(total, held) || 1;

  const parts = holding.map((v) => ({
    kind: memoryKind(v), size: v.memory_gib, label: v.name,
    text: `${v.name}: ${gib(v.memory_gib)}, ${KIND_LABELS[memoryKind(v)]}, ${STATE_LABELS[v.state] || v.state}`,
  }));
  if (other > 0.005) parts.push({ kind: "other", size: other, label: "other", text: `Used outside dgxmm: ${gib(other)}` });
  parts.push({ kind: "free", size: free - other, label: "free", text: `Free: ${gib(free - other)}` });

  bar.replaceChildren(...parts.filter((p) => p.size > 0).map((p) => {
    const seg = document.createElement("span");
    seg.className = `seg seg-${p.kind}`;
    seg.style.width = `${(p.size / scale) * 100}%`;
    seg.title = p.text;
    seg.textContent = p.size / scale > 0.08 ? p.label : "";
    return seg;
  }));
  const line = `${gib(held)} of ${gib(total)} held (${gib(fixed)} by always-on and system deployments), ${gib(free - other)} free`;
  bar.setAttribute("aria-label", `Memory: ${line}`);
  summary.textContent = `Usable memory ${gib(total)} (${mem.source}): ${gib(held)} held, ${gib(free - other)} free.`;
  legend.replaceChildren(...parts.map((p) => {
    const item = document.createElement("li");
    const swatch = document.createElement("span");
    swatch.className = `swatch seg-${p.kind}`;
    swatch.setAttribute("aria-hidden", "true");
    item.append(swatch, p.text);
    return item;
  }));
}
