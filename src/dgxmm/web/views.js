// The console's views beyond the deployments and their detail: each registers itself here with its
// title and what to do when it is shown and left, and hears the main event stream's messages, so a
// new view is a part of the page (web/parts/), its own module and one import in app.js.

const views = new Map(); // name (the hash, "#name") -> { title, open, close, event }

/** Register a view shown at `#name`; its markup is the element with id `${name}-view`. `open()`
 * runs each time it is shown, `close()` when it is left or on logout, `event(type, data)` for every
 * message of the main event stream (deployment, memory, log, model, ...), `resync()` after the
 * stream came back from a drop (what it missed meanwhile is to be read again). */
export function addView(name, { title, open = () => {}, close = () => {}, event = () => {}, resync = () => {} }) {
  views.set(name, { title, open, close, event, resync });
}

/** The registered view a location hash names, or null. */
export function viewOf(hash) {
  const name = hash.startsWith("#") ? hash.slice(1) : "";
  return views.has(name) ? name : null;
}

/** Show `current` (a registered name, or anything else for none of them) and hide the rest. */
export function showView(current, loggedIn) {
  for (const [name, view] of views) {
    const shown = loggedIn && name === current;
    const box = document.getElementById(`${name}-view`);
    const was = !box.hidden;
    box.hidden = !shown;
    if (shown) view.open();
    else if (was) view.close();
  }
}

export function titleOf(name) {
  return views.has(name) ? views.get(name).title : null;
}

export function eventToViews(type, data) {
  for (const view of views.values()) view.event(type, data);
}

export function resyncViews() {
  for (const view of views.values()) view.resync();
}

export function closeViews() {
  for (const view of views.values()) view.close();
}
