// The toolbar of the deployments page: cards or table, the filters (name, status, mode) and the
// order (problems first unless the user picks another, here or on a column of the table) that
// apply to both. The choices are this browser's preferences (prefs.js).

import { loadPrefs, savePrefs } from "./prefs.js";
import { FILTER_OF } from "./status.js";
import { ordered, rowOf, sortRows } from "./table.js";

const $ = (id) => document.getElementById(id);
const prefs = loadPrefs();
let deployments = new Map(); // id -> view (the app's)
let cards = new Map(); // id -> card element (the app's)

function matches(view) {
  const name = prefs.name.trim().toLowerCase();
  if (name && !view.name.toLowerCase().includes(name) && !view.served_name.toLowerCase().includes(name)) return false;
  if (prefs.state && FILTER_OF[(view.status || {}).code] !== prefs.state) return false;
  return !prefs.mode || view.mode === prefs.mode;
}

/** Show the cards and rows that pass the filters, and say how many. */
export function applyFilters() {
  let shown = 0;
  for (const [id, view] of deployments) {
    const visible = matches(view);
    shown += visible ? 1 : 0;
    if (cards.get(id)) cards.get(id).hidden = !visible;
    if (rowOf(id)) rowOf(id).hidden = !visible;
  }
  const filtered = prefs.name || prefs.state || prefs.mode;
  $("filter-count").textContent = filtered ? `Showing ${shown} of ${deployments.size}.` : `${deployments.size} deployments.`;
}

/** Put the cards and the table's rows in the chosen order (each list not while the focus is
 * inside it, so nobody loses their place). */
export function sortNow() {
  const sorted = ordered(deployments.values(), prefs.sort, prefs.descending);
  sortRows(sorted, prefs.sort, prefs.descending);
  $("sort-order").value = prefs.sort;
  const box = $("cards");
  if (box.contains(document.activeElement)) return;
  const wanted = sorted.map((v) => cards.get(v.id)).filter(Boolean);
  const current = [...box.children];
  if (wanted.length === current.length && wanted.every((li, i) => li === current[i])) return;
  box.append(...wanted);
}

function applyLayout() {
  $("cards").hidden = prefs.layout !== "cards";
  $("table-wrap").hidden = prefs.layout !== "table";
  sortNow();
}

/** Show the remembered choices (after logging in). */
export function restorePrefs() {
  document.querySelector(`input[name="layout"][value="${prefs.layout}"]`).checked = true;
  $("filter-name").value = prefs.name;
  $("filter-state").value = prefs.state;
  $("filter-mode").value = prefs.mode;
  applyLayout();
}

/** Wire the toolbar to the app's deployments and cards (maps it keeps current). */
export function initToolbar(deploymentMap, cardMap) {
  deployments = deploymentMap;
  cards = cardMap;
  document.querySelector(".toolbar").addEventListener("input", () => {
    prefs.layout = document.querySelector('input[name="layout"]:checked').value;
    prefs.name = $("filter-name").value;
    prefs.state = $("filter-state").value;
    prefs.mode = $("filter-mode").value;
    if ($("sort-order").value !== prefs.sort) {
      prefs.sort = $("sort-order").value;
      prefs.descending = false;
    }
    savePrefs(prefs);
    applyLayout();
    applyFilters();
  });
  $("dep-table").querySelector("thead").addEventListener("click", (event) => {
    const th = event.target.closest("th[data-sort]");
    if (!th) return;
    prefs.descending = prefs.sort === th.dataset.sort ? !prefs.descending : false;
    prefs.sort = th.dataset.sort;
    savePrefs(prefs);
    sortNow();
  });
  $("dep-rows").addEventListener("focusout", () => setTimeout(sortNow));
  $("cards").addEventListener("focusout", () => setTimeout(sortNow));
}
