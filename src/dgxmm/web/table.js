// The table view: one compact row per deployment for hosts with many models, sortable by any
// column (the choice is remembered with the other preferences). Rows are updated in place and
// reordered only while the keyboard focus is elsewhere, so nobody loses their place.

import { DEVICES, ENGINE_LABELS, agoElement, gib, memoryText } from "./format.js";
import { devicesText } from "./devices.js";
import { renderStatus } from "./status.js";
import { buildActions, isDeclared, updateActions } from "./cards.js";
import { problemRank } from "./problems.js";

const body = document.getElementById("dep-rows");
const rows = new Map(); // id -> tr
const STATUS_RANK = {
  failed: 0, queued: 1, loading: 2, switching: 3, serving: 4, idle: 5, ready: 6, asleep: 7,
  stopping: 8, cold: 9, stopped: 10, planned: 11,
};

// The orders of the overview (cards and rows alike), by the sort's name; ties go by name.
const KEYS = {
  problems: problemRank,
  name: (v) => v.name.toLowerCase(),
  status: (v) => STATUS_RANK[(v.status || {}).code] ?? 99,
  mode: (v) => v.mode,
  engine: (v) => v.engine,
  memory: (v) => v.memory_gib,
  gpus: (v) => devicesText(v),
  inflight: (v) => (v.ondemand ? v.ondemand.inflight : -1),
  queued: (v) => (v.ondemand ? v.ondemand.queued : -1),
  last: (v) => (v.status && v.status.last_request_at) || 0,
  changed: (v) => v.state_changed_at,
  created: (v) => v.created_at,
};

function cell(label, content) {
  const td = document.createElement("td");
  td.dataset.label = label;
  td.dataset.col = label;
  if (content instanceof Node) td.append(content);
  else td.textContent = content == null ? "" : String(content);
  return td;
}

function fill(tr, view) {
  const [name, status, mode, engine, memory, gpus, inflight, queued, last, changed, actions] = tr.cells;
  const link = name.querySelector("a");
  link.textContent = view.name;
  name.querySelector(".read-only").textContent = isDeclared(view) ? ` declared in ${view.declared_in}` : ""; // (spaced from the name only when there)
  renderStatus(status.querySelector(".status-line"), null, view);
  mode.textContent = view.mode === "on_demand" ? "On demand" : "Always on";
  engine.textContent = ENGINE_LABELS[view.engine] || view.engine;
  memory.textContent = gib(view.memory_gib)
    + (view.memory_measured_gib == null ? "" : ` · ${gib(view.memory_measured_gib)} measured`);
  memory.title = memoryText(view);
  gpus.textContent = devicesText(view);
  gpus.hidden = !gpus.textContent; // a pooled host has no GPUs column
  inflight.textContent = view.ondemand ? String(view.ondemand.inflight) : "—";
  queued.textContent = view.ondemand ? String(view.ondemand.queued) : "—";
  const at = view.status && view.status.last_request_at;
  last.replaceChildren(at ? agoElement(at) : "—");
  changed.replaceChildren(agoElement(view.state_changed_at));
  updateActions(actions.firstChild, view);
}

export function upsertRow(view) {
  let tr = rows.get(view.id);
  if (!tr) {
    tr = document.createElement("tr");
    tr.dataset.id = view.id;
    const link = document.createElement("a");
    link.href = `#deployment/${encodeURIComponent(view.id)}`;
    link.id = `row-name-${view.id}`;
    const status = document.createElement("p");
    status.className = "status-line";
    // The card's actions, each described by the row's name (issue 41 item 13).
    const actions = document.createElement("div");
    actions.className = "actions row-actions";
    buildActions(actions, link.id);
    const declared = document.createElement("span");
    declared.className = "read-only";
    const named = document.createDocumentFragment();
    named.append(link, declared);
    tr.append(cell("Name", named), cell("Status", status), cell("Mode"), cell("Engine"), cell("Memory"),
      cell("GPUs"), cell("In flight"), cell("Queued"), cell("Last request"), cell("Changed"), cell("Actions", actions));
    rows.set(view.id, tr);
    body.append(tr);
  }
  fill(tr, view);
  document.querySelector("#dep-table th[data-gpus]").hidden = !DEVICES.length;
  return tr;
}

export function removeRow(id) {
  const tr = rows.get(id);
  if (tr) tr.remove();
  rows.delete(id);
}

export function clearRows() {
  rows.clear();
  body.replaceChildren();
}

export function rowOf(id) {
  return rows.get(id);
}

/** `views` in the order of `sort` (a KEYS name; an unknown one is problems first). */
export function ordered(views, sort, descending) {
  const key = KEYS[sort] || KEYS.problems;
  return [...views].sort((a, b) => {
    const ka = key(a);
    const kb = key(b);
    const c = ka < kb ? -1 : ka > kb ? 1 : a.name.localeCompare(b.name);
    return descending ? -c : c;
  });
}

/** Put the rows in the order of `sorted` (`ordered`'s answer for `sort`), shown on its column's
 * header, unless the focus is inside the table. */
export function sortRows(sorted, sort, descending) {
  for (const th of document.querySelectorAll("#dep-table th[data-sort]")) {
    if (th.dataset.sort === sort) th.setAttribute("aria-sort", descending ? "descending" : "ascending");
    else th.removeAttribute("aria-sort");
  }
  if (body.contains(document.activeElement)) return;
  const wanted = sorted.map((v) => rows.get(v.id)).filter(Boolean);
  const current = [...body.rows];
  if (wanted.length === current.length && wanted.every((tr, i) => tr === current[i])) return;
  body.append(...wanted);
}
