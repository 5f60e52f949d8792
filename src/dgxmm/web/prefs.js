// What this browser's user chose to see (cards or table, filters, sort), remembered across
// visits in localStorage under one key. Only these choices live there: the admin token is kept
// in sessionStorage by api.js and never here.

const KEY = "dgxmm.ui-preferences";
const DEFAULTS = { layout: "cards", name: "", state: "", mode: "", sort: "problems", descending: false };

export function loadPrefs() {
  try {
    const saved = JSON.parse(localStorage.getItem(KEY) || "{}");
    const prefs = { ...DEFAULTS };
    for (const key of Object.keys(DEFAULTS)) {
      if (typeof saved[key] === typeof DEFAULTS[key]) prefs[key] = saved[key];
    }
    return prefs;
  } catch {
    return { ...DEFAULTS };
  }
}

export function savePrefs(prefs) {
  try {
    const kept = {};
    for (const key of Object.keys(DEFAULTS)) kept[key] = prefs[key];
    localStorage.setItem(KEY, JSON.stringify(kept));
  } catch {
    // storage full or disabled: the choice lasts for this page only
  }
}
