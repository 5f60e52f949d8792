// Labels and number formats shared by the views.

export const STATE_LABELS = {
  planned: "Planned", starting: "Starting", ready: "Ready", asleep: "Asleep",
  stopping: "Stopping", stopped: "Stopped", failed: "Failed",
};

// What the server knows and the pages show: engine kinds by name, and the idle timeout's bounds
// (settings on the server). Filled from GET /api/host (learnHost) before anything is shown.
export const ENGINE_LABELS = {};
export const ENGINES = [];
export const IDLE = { min: null, max: null, default: null };
// The host's devices when it has several (GET /api/host devices); empty on a pooled host.
export const DEVICES = [];

export const LITELLM_LABELS = {
  registered: "Registered", pending: "Pending", error: "Error", disabled: "Not used",
};

// States whose engine holds its declared memory (the deployer's HOLDS_MEMORY).
export const HOLDS_MEMORY = new Set(["starting", "ready", "asleep", "stopping"]);

/** Take what the server says of itself (GET /api/host): engine kinds, idle timeout bounds,
 * devices. */
export function learnHost(host) {
  DEVICES.splice(0, DEVICES.length, ...(host.memory.pooled ? [] : host.devices));
  ENGINES.splice(0, ENGINES.length, ...host.engines);
  for (const kind of host.engines) ENGINE_LABELS[kind.name] = kind.label;
  IDLE.min = host.ondemand.idle_timeout_min_s;
  IDLE.max = host.ondemand.idle_timeout_max_s;
  IDLE.default = host.ondemand.idle_timeout_s;
  for (const slot of document.querySelectorAll("[data-idle-range]")) slot.textContent = idleRange();
}

/** "60 s to 24 h": the idle timeout's bounds as the server has them. */
export function idleRange(joiner = "to") {
  const low = IDLE.min < 3600 ? `${Number(IDLE.min.toFixed(2))} s` : duration(IDLE.min);
  return `${low} ${joiner} ${duration(IDLE.max)}`;
}

export function gib(value) {
  const v = Number(value);
  // Below 0.01 GiB two decimals read "0 GiB": such a size is written in MiB.
  if (v > 0 && v < 0.01) return `${Number((v * 1024).toPrecision(2))} MiB`;
  return `${Number(v.toFixed(2))} GiB`;
}

/** The declared memory, with the limit a vLLM engine is launched with (docs/engines.md), and
 * what the running engine was measured at beside it. */
export function memoryText(view) {
  const limit = view.memory_limit;
  const measured = view.memory_measured_gib;
  return gib(view.memory_gib) + (limit ? ` (${limit.flag} ${limit.value})` : "")
    + (measured == null ? "" : `, ${gib(measured)} measured`);
}

/** What a deployment holding memory counts for: the larger of declared and measured. */
export function heldGib(view) {
  return Math.max(view.memory_gib, view.memory_measured_gib || 0);
}

/** 600 -> "10 min", 7200 -> "2 h", 90 -> "90 s". */
export function duration(seconds) {
  if (seconds >= 3600 && seconds % 3600 === 0) return `${seconds / 3600} h`;
  if (seconds >= 60 && seconds % 60 === 0) return `${seconds / 60} min`;
  return `${Number(Number(seconds).toFixed(2))} s`;
}

/** The largest unit that states `seconds` exactly: [value, unitSeconds]. */
export function splitDuration(seconds) {
  for (const unit of [3600, 60]) {
    if (seconds >= unit && seconds % unit === 0) return [seconds / unit, unit];
  }
  return [seconds, 1];
}

/** 75 -> "1:15", 3725 -> "1:02:05": what a countdown shows. */
export function mmss(seconds) {
  const s = Math.max(0, Math.round(seconds));
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const pad = (n) => String(n).padStart(2, "0");
  return h ? `${h}:${pad(m)}:${pad(s % 60)}` : `${m}:${pad(s % 60)}`;
}

/** How long ago a Unix time was, in words: "just now", "12 s ago", "2 min ago", "3 h ago". */
export function agoText(unix, now = Date.now() / 1000) {
  const s = Math.max(0, now - unix);
  if (s < 5) return "just now";
  if (s < 60) return `${Math.floor(s)} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400 * 2) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} days ago`;
}

/** A `<time>` element that says how long ago, kept current by the status ticker. */
export function agoElement(unix) {
  const el = document.createElement("time");
  el.dateTime = isoTime(unix);
  el.dataset.ago = String(unix);
  el.title = clock(unix);
  el.textContent = agoText(unix);
  return el;
}

/** A Unix time: the clock time today, else date and time. */
export function clock(unix) {
  const when = new Date(unix * 1000);
  const today = new Date().toDateString() === when.toDateString();
  return today ? when.toLocaleTimeString() : when.toLocaleString();
}

export function isoTime(unix) {
  return new Date(unix * 1000).toISOString();
}

/** A `<time>` element showing a Unix time. */
export function timeElement(unix) {
  const el = document.createElement("time");
  el.dateTime = isoTime(unix);
  el.textContent = clock(unix);
  return el;
}

export function modeText(view) {
  if (view.role && view.role !== "model") return `Always on (${view.role})`;
  if (view.mode !== "on_demand") return "Always on";
  const idle = view.idle_timeout_s == null ? "default idle timeout"
    : view.idle_timeout_s === 0 ? "never stopped for idleness (make-room may stop it)"
    : `idle timeout ${duration(view.idle_timeout_s)}`;
  return `On demand, ${idle}${view.preload ? ", preloaded" : ""}`;
}

/** The names callers give as `model`: the served name, then the aliases the model router knows. */
export function modelNames(view) {
  const aliases = view.aliases || [];
  return aliases.length ? `${view.served_name} (also ${aliases.join(", ")})` : view.served_name;
}

/** Which part of the memory bar a deployment belongs to. */
export function memoryKind(view) {
  if (view.role && view.role !== "model") return "system";
  return view.mode === "on_demand" ? "ondemand" : "always";
}

export const KIND_LABELS = { system: "system", always: "always on", ondemand: "on demand" };
