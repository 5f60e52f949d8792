// Labels and number formats shared by the views.

export const STATE_LABELS = {
  planned: "Planned", starting: "Starting", ready: "Ready", asleep: "Asleep",
  stopping: "Stopping", stopped: "Stopped", failed: "Failed",
};

// The on-demand phase of status(id). "failed" has no phase badge: the state badge says Failed.
export const PHASE_LABELS = {
  queued: "Queued", starting_for_request: "Starting for a request", serving: "Serving",
  sleeping: "Sleeping", idle: "Idle",
};

export const ENGINE_LABELS = { llamacpp: "llama.cpp", vllm: "vLLM", command: "Command" };

export const LITELLM_LABELS = {
  registered: "Registered", pending: "Pending", error: "Error", disabled: "Not used",
};

// States whose engine holds its declared memory (the deployer's HOLDS_MEMORY).
export const HOLDS_MEMORY = new Set(["starting", "ready", "asleep", "stopping"]);

export const IDLE_MIN_S = 60;
export const IDLE_MAX_S = 86400;

export function gib(value) {
  return `${Number(Number(value).toFixed(2))} GiB`;
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
  const idle = view.idle_timeout_s == null ? "default idle timeout" : `idle timeout ${duration(view.idle_timeout_s)}`;
  return `On demand, ${idle}`;
}

/** Which part of the memory bar a deployment belongs to. */
export function memoryKind(view) {
  if (view.role && view.role !== "model") return "system";
  return view.mode === "on_demand" ? "ondemand" : "always";
}

export const KIND_LABELS = { system: "system", always: "always on", ondemand: "on demand" };
