// The Models view (#models): the model store's disk, a pull by repository and patterns with
// the repository's files and sizes listed first (pullform.js), and every model with its
// progress (bytes, speed, time left, from `event: model`), the deployments that use it, Cancel,
// Delete and Pull again.

import { api } from "./api.js";
import { confirmAction } from "./forms.js";
import { gib } from "./format.js";
import { hubName, sizeText } from "./hubfiles.js";
import { wirePullForm } from "./pullform.js";
import { addView } from "./views.js";

const $ = (id) => document.getElementById(id);
const records = new Map(); // id -> the model's record (GET api/models, then event: model)
const deployments = new Map(); // id -> {name, model}: a change of either changes models' used_by
const ids = new Map(); // deployment name -> id, to link a user to its detail view
let disk = null; // GET api/host's disk
let shown = false;
let refreshTimer = null;

// A model's status as a badge, in the deployments' colours and shapes (style.css .status-*).
const STATUS = {
  downloading: { label: "Downloading", glyph: "◐", look: "loading transitional" },
  ready: { label: "Ready", glyph: "●", look: "ready" },
  failed: { label: "Failed", glyph: "✕", look: "failed" },
  cancelled: { label: "Cancelled", glyph: "□", look: "stopped" },
};

/** "about 3 min left", as the deployment's state_reason says it (modelstore/names.py). */
function leftText(seconds) {
  if (seconds < 60) return `about ${Math.max(Math.round(seconds), 1)} s left`;
  if (seconds < 5400) return `about ${Math.round(seconds / 60)} min left`;
  return `about ${(seconds / 3600).toFixed(1)} h left`;
}

/** "42 %: 1.93 of 4.58 GiB, 120 MiB/s, about 30 s left". */
export function progressText(r) {
  const share = r.bytes_total ? Math.floor((100 * r.bytes_done) / r.bytes_total) : 0;
  let text = `${share} %: ${sizeText(r.bytes_done)} of ${sizeText(r.bytes_total)}`;
  if (r.bytes_per_s > 0) {
    text += `, ${sizeText(r.bytes_per_s)}/s, ${leftText((r.bytes_total - r.bytes_done) / r.bytes_per_s)}`;
  } else if (r.bytes_per_s === 0) {
    text += ", no bytes in the last seconds";
  }
  return text;
}

/** The names a deployment gives this model: each GGUF file, or the snapshot for a whole pull. */
function deployNames(r) {
  const ggufs = r.files.filter((f) => f.path.endsWith(".gguf")).map((f) => hubName(r.repo, r.revision, f.path));
  return r.include.length ? ggufs : [hubName(r.repo, r.revision), ...ggufs];
}

function listOf(items, max = 4) {
  const shownItems = items.slice(0, max);
  return items.length > max ? [...shownItems, `and ${items.length - max} more`] : shownItems;
}

function usersOf(r) {
  if (!r.used_by.length) return document.createTextNode("No deployment");
  const box = document.createDocumentFragment();
  r.used_by.forEach((name, i) => {
    if (i) box.append(", ");
    const id = ids.get(name);
    if (!id) box.append(name);
    else {
      const link = document.createElement("a");
      link.href = `#deployment/${encodeURIComponent(id)}`;
      link.textContent = name;
      box.append(link);
    }
  });
  return box;
}

function button(action, text, r, danger = false) {
  const b = document.createElement("button");
  b.type = "button";
  b.dataset.modelAction = action;
  b.dataset.needsLive = "";
  b.textContent = text;
  b.setAttribute("aria-describedby", `model-${r.id}-title`); // "Delete", of which model
  if (danger) b.className = "danger";
  b.disabled = document.body.dataset.conn !== "live";
  return b;
}

function fill(li, r) {
  const field = (name) => li.querySelector(`[data-field="${name}"]`);
  li.dataset.id = r.id;
  li.dataset.status = r.status;
  field("repo").textContent = r.repo + (r.include.length ? ` (${r.include.join(", ")})` : "");
  field("repo").id = `model-${r.id}-title`;
  const s = STATUS[r.status] || { label: r.status, glyph: "•", look: "stopped" };
  const badge = field("status");
  badge.className = `badge status-${s.look}`;
  badge.querySelector(".glyph").textContent = s.glyph;
  const label = badge.querySelector(".label");
  if (label.textContent !== s.label) label.textContent = s.label; // (a live region: said once per change)
  const downloading = r.status === "downloading";
  field("progress-box").hidden = !(downloading || r.status === "cancelled");
  const bar = field("progress");
  bar.max = Math.max(r.bytes_total, 1);
  bar.value = r.bytes_done;
  bar.setAttribute("aria-label", `Download of ${r.repo}`);
  field("progress-text").textContent = downloading ? progressText(r)
    : `Stopped at ${sizeText(r.bytes_done)} of ${sizeText(r.bytes_total)}.`;
  field("revision").textContent = r.revision + (r.commit ? ` (${r.commit.slice(0, 10)})` : "");
  field("size").textContent = sizeText(r.bytes_total);
  field("files").textContent = listOf(r.files.map((f) => `${f.path} (${sizeText(f.size)})`)).join(", ") || "—";
  field("used_by").replaceChildren(usersOf(r));
  if (li.dataset.users !== undefined && li.dataset.users !== r.used_by.join(",")) field("error").textContent = "";
  li.dataset.users = r.used_by.join(","); // (a refusal that named other users is no longer true)
  const names = r.status === "ready" ? listOf(deployNames(r)) : [];
  field("names").closest("div").hidden = !names.length;
  field("names").replaceChildren(...names.map((name, i) => {
    const code = document.createElement(name.startsWith("hf://") ? "code" : "span");
    code.textContent = name;
    return i ? [" ", code] : [code];
  }).flat());
  const reason = field("reason");
  reason.hidden = !r.error;
  reason.textContent = r.error ? `Why it failed: ${r.error}` : "";
  const actions = li.querySelector(".actions");
  if (actions.dataset.status !== r.status) {
    actions.replaceChildren(...(downloading ? [button("cancel", "Cancel", r)]
      : [button("delete", "Delete", r, true), ...(r.status === "ready" ? [] : [button("retry", "Pull again", r)])]));
    actions.dataset.status = r.status;
  }
}

function item(id) {
  return $("models-list").querySelector(`li[data-id="${CSS.escape(id)}"]`);
}

/** Show `r` (a record, or one with `removed`), in creation order. */
function render(r) {
  let li = item(r.id);
  if (r.removed) {
    if (li) li.remove();
  } else {
    if (!li) {
      li = $("model-template").content.firstElementChild.cloneNode(true);
      $("models-list").append(li);
    }
    fill(li, r);
  }
  $("models-empty").hidden = records.size > 0;
}

function renderDisk() {
  if (!disk) return;
  const other = Math.max(disk.total_gib - disk.free_gib - disk.held_gib, 0);
  $("models-disk").textContent = `${disk.dir}: ${gib(disk.free_gib)} free of ${gib(disk.total_gib)}; `
    + `the models hold ${gib(disk.held_gib)}; a pull leaves ${gib(disk.reserve_gib)} free.`;
  $("models-diskbar-held").style.width = `${(100 * disk.held_gib) / Math.max(disk.total_gib, 1e-9)}%`;
  $("models-diskbar-other").style.width = `${(100 * other) / Math.max(disk.total_gib, 1e-9)}%`;
}

async function refreshDisk() {
  disk = (await api("host")).disk;
  renderDisk();
}

/** Every record as the API has it now: cards updated in place (the focus and what a card says
 * stay), those of removed models dropped. */
async function load() {
  const [list, host] = await Promise.all([api("models"), api("host")]);
  const now = new Set(list.map((r) => r.id));
  for (const id of [...records.keys()]) {
    if (!now.has(id)) {
      render({ ...records.get(id), removed: true });
      records.delete(id);
    }
  }
  for (const r of list) {
    records.set(r.id, r);
    render(r);
  }
  $("models-empty").hidden = records.size > 0;
  disk = host.disk;
  renderDisk();
}

/** The models' used_by after deployments changed (debounced: a page opening sends them all). */
function refreshSoon() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(() => { if (shown) load().catch(() => {}); }, 500);
}

function say(text) {
  $("models-status").textContent = text;
}

function event(type, data) {
  if (type === "deployment") {
    const known = deployments.get(data.id);
    if (data.removed) deployments.delete(data.id);
    else deployments.set(data.id, { name: data.name, model: data.model });
    ids.set(data.name, data.id);
    if (shown && (data.removed || !known || known.model !== data.model || known.name !== data.name)) refreshSoon();
  } else if (type === "model" && shown) {
    const before = records.get(data.id);
    if (data.removed) records.delete(data.id);
    else records.set(data.id, data);
    render(data);
    if (data.removed || !before || before.status !== data.status) refreshDisk().catch(() => {});
  }
}

async function act(r, action, li) {
  const slot = li.querySelector('[data-field="error"]');
  slot.textContent = "";
  if (action === "retry") {
    await api("models", { method: "POST", body: { repo: r.repo, revision: r.revision, include: r.include } });
    say(`${r.repo}: pulled again, from where it stopped.`);
    return;
  }
  const cancel = action === "cancel";
  const asked = await confirmAction(
    cancel ? `Cancel the download of ${r.repo}?` : `Delete ${r.repo}?`,
    cancel
      ? `The ${sizeText(r.bytes_done)} downloaded so far are deleted with it.`
      : `Its ${sizeText(r.bytes_total)} of files are deleted from ${disk ? disk.dir : "the model store"}, except those another model shares.`,
    cancel ? "Cancel the download" : "Delete",
    cancel ? "Keep downloading" : "Keep it",
  );
  if (!asked) return;
  try {
    await api(`models/${encodeURIComponent(r.id)}`, { method: "DELETE" });
    records.delete(r.id);
    render({ ...r, removed: true });
    say(cancel ? `The download of ${r.repo} is cancelled.` : `${r.repo} deleted.`);
    refreshDisk().catch(() => {});
  } catch (error) {
    const why = error.code === "model_in_use"
      ? `Not ${cancel ? "cancelled" : "deleted"}: ${error.message.replace(/^model /, "")}. Remove those deployments or change their model first.`
      : error.message;
    slot.textContent = why;
    say(`${r.repo}: not ${cancel ? "cancelled" : "deleted"}.`);
  }
}

$("models-list").addEventListener("click", (e) => {
  const b = e.target.closest("button[data-model-action]");
  if (!b || b.disabled) return;
  const li = b.closest("li[data-id]");
  const r = records.get(li.dataset.id);
  if (!r) return;
  b.disabled = true;
  act(r, b.dataset.modelAction, li)
    .catch((error) => { li.querySelector('[data-field="error"]').textContent = error.message; })
    .finally(() => { b.disabled = document.body.dataset.conn !== "live"; });
});

wirePullForm({
  disk: () => disk,
  pulled(r, already) {
    records.set(r.id, r);
    render(r);
    say(already ? `${r.repo} is here already: nothing to download.`
      : r.status === "failed" ? `${r.repo}: the pull failed: ${r.error}` : `Pulling ${r.repo}: ${sizeText(r.bytes_total)}.`);
  },
});

addView("models", {
  title: "Models",
  open() {
    shown = true;
    load().catch((error) => say(error.message));
  },
  close() {
    shown = false;
  },
  event,
  resync() {
    if (shown) load().catch(() => {});
  },
});
