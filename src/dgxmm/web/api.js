// The admin API from the browser: the token (session storage only), JSON calls with the API's
// error shape, and the event stream read with fetch() so it can send the bearer header
// (EventSource cannot), reconnecting with backoff whenever it ends.

const TOKEN_KEY = "dgxmm.admin-token";

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY) || "",
  set: (value) => sessionStorage.setItem(TOKEN_KEY, value),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

export class ApiError extends Error {
  constructor(status, code, message, field = null, errors = null) {
    super(message);
    this.status = status;
    this.code = code;
    this.field = field;
    this.errors = errors || (field ? [{ field, message }] : []); // every invalid field of a 422
  }
}

let onUnauthorized = () => {};

/** Called when any call is refused with 401: the token is wrong or was changed on the host. */
export function setUnauthorizedHandler(handler) {
  onUnauthorized = handler;
}

/** Call `api/<path>` (relative, so any base path works); resolves to the JSON answer. */
export async function api(path, { method = "GET", body, quiet401 = false } = {}) {
  const headers = { Authorization: `Bearer ${token.get()}`, Accept: "application/json" };
  const init = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(`api/${path}`, init);
  } catch (err) {
    throw new ApiError(0, "unreachable", `dgxmm did not answer (${err.message}).`);
  }
  const text = await resp.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!resp.ok) {
    const e = (data && data.error) || {};
    const error = new ApiError(resp.status, e.code || "http_error",
      e.message || text || `HTTP ${resp.status}`, e.field || null, e.errors || null);
    if (resp.status === 401 && !quiet401) onUnauthorized(error);
    throw error;
  }
  return data;
}

/**
 * A Server-Sent Events stream of the API (`events` by default; the log follower uses another
 * path). Handlers: open(), event(type, data), closed(delayMs) before each reconnect,
 * unauthorized(), refused(status) for any other 4xx (the stream then stops). Reconnects after
 * 1 s, doubling to 30 s, or at once with retryNow(); a stream that sends nothing (not even the
 * 15 s ping) for 45 s is treated as dropped.
 */
export class EventStream {
  constructor(handlers, path = "events") {
    this.h = handlers;
    this.path = path;
    this.stopped = true;
    this.abort = null;
    this.wake = null;
  }

  /** While waiting to reconnect: try now. */
  retryNow() {
    if (this.wake) this.wake();
  }

  start() {
    if (!this.stopped) return;
    this.stopped = false;
    this.run();
  }

  stop() {
    this.stopped = true;
    if (this.abort) this.abort.abort();
    if (this.wake) this.wake();
  }

  async run() {
    let delay = 1000;
    while (!this.stopped) {
      const ctrl = new AbortController();
      this.abort = ctrl;
      try {
        const resp = await fetch(`api/${this.path}`, {
          headers: { Authorization: `Bearer ${token.get()}`, Accept: "text/event-stream" },
          cache: "no-store",
          signal: ctrl.signal,
        });
        if (resp.status === 401) {
          this.stopped = true;
          this.h.unauthorized();
          return;
        }
        if (resp.status >= 400 && resp.status < 500) {
          this.stopped = true;
          if (this.h.refused) this.h.refused(resp.status);
          return;
        }
        if (!resp.ok || !resp.body) throw new Error(`HTTP ${resp.status}`);
        delay = 1000;
        this.h.open();
        await this.read(resp.body, ctrl);
      } catch {
        // a network error or an abort: reconnect below unless stopped
      }
      if (this.stopped) return;
      this.h.closed(delay);
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, delay);
        this.wake = () => { clearTimeout(timer); resolve(); };
      });
      this.wake = null;
      delay = Math.min(delay * 2, 30000);
    }
  }

  async read(body, ctrl) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let type = "";
    let data = [];
    let silence = null;
    const watch = () => {
      clearTimeout(silence);
      silence = setTimeout(() => ctrl.abort(), 45000);
    };
    watch();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        watch();
        buffer += value;
        for (;;) {
          const match = /\r\n|\r|\n/.exec(buffer);
          // A lone "\r" at the end may be the first half of "\r\n": wait for more.
          if (!match || (match[0] === "\r" && match.index === buffer.length - 1)) break;
          const line = buffer.slice(0, match.index);
          buffer = buffer.slice(match.index + match[0].length);
          if (line === "") {
            if (data.length) this.dispatch(type || "message", data.join("\n"));
            type = "";
            data = [];
          } else if (!line.startsWith(":")) {
            const colon = line.indexOf(":");
            const field = colon < 0 ? line : line.slice(0, colon);
            let val = colon < 0 ? "" : line.slice(colon + 1);
            if (val.startsWith(" ")) val = val.slice(1);
            if (field === "event") type = val;
            else if (field === "data") data.push(val);
          }
        }
      }
    } finally {
      clearTimeout(silence);
    }
  }

  dispatch(type, text) {
    let data;
    try {
      data = JSON.parse(text);
    } catch {
      return;
    }
    this.h.event(type, data);
  }
}
