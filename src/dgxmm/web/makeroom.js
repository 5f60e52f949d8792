// A start that does not fit (409 insufficient_memory): the idle on-demand models holding memory
// are named, with two offers: stop just enough of them (the fewest that free enough, least
// recently used first among sets as small) and then start, or stop every idle one and then
// start. Nothing is stopped unasked.

/** The idle (or asleep) on-demand models other than `exceptId`, least recently used first. */
export function idleHolders(views, exceptId) {
  return views
    .filter((v) => v.id !== exceptId && v.mode === "on_demand" && ["idle", "asleep"].includes((v.status || {}).code))
    .sort((a, b) => ((a.status || {}).last_request_at || 0) - ((b.status || {}).last_request_at || 0));
}

const SEARCHED = 16; // idle models searched for the smallest set; past that, the largest first

/**
 * The fewest of `idle` (least recently used first) whose memory covers `shortfallGib`: among sets
 * of that size, the one whose models were used least recently (in `idle`'s order); null if all
 * of them together do not cover it.
 */
export function enoughOf(idle, shortfallGib) {
  const covers = (set) => set.reduce((sum, v) => sum + v.memory_gib, 0) >= shortfallGib - 1e-9;
  if (!covers(idle)) return null;
  if (shortfallGib <= 1e-9) return [];
  if (idle.length > SEARCHED) {
    const largest = [...idle].sort((a, b) => b.memory_gib - a.memory_gib);
    const chosen = [];
    for (const view of largest) {
      if (covers(chosen)) break;
      chosen.push(view);
    }
    return idle.filter((v) => chosen.includes(v));
  }
  for (let size = 1; size <= idle.length; size += 1) {
    const found = firstCovering(idle, size, 0, [], covers);
    if (found) return found;
  }
  return null;
}

/** The first set of `size` of `idle[from..]` (in order) added to `taken` that `covers`. */
function firstCovering(idle, size, from, taken, covers) {
  if (taken.length === size) return covers(taken) ? taken : null;
  for (let i = from; i <= idle.length - (size - taken.length); i += 1) {
    const found = firstCovering(idle, size, i + 1, [...taken, idle[i]], covers);
    if (found) return found;
  }
  return null;
}

function listNames(views) {
  const n = views.map((v) => v.name);
  return n.length < 2 ? n.join("") : `${n.slice(0, -1).join(", ")} and ${n[n.length - 1]}`;
}

/**
 * The offers for `view`, which needs `shortfallGib` more than is free: `{ text, some, all }`,
 * `some` the models to stop for it (null if the idle ones cannot cover it), `all` every idle
 * one; null when no idle model holds memory (there is nothing to offer). `then` says what
 * follows the stops ("start", or "switch to always on" for a mode change).
 */
export function offers(view, views, shortfallGib, then = "start") {
  const idle = idleHolders(views, view.id);
  if (!idle.length) return null;
  const held = idle.reduce((sum, v) => sum + v.memory_gib, 0);
  const text = `Idle models hold ${held.toFixed(1)} GiB: ${idle.map((v) => `${v.name} (${v.memory_gib} GiB)`).join(", ")}.`;
  const some = enoughOf(idle, shortfallGib);
  return { text, some, all: idle, then, someLabel: some && `Stop ${listNames(some)}, then ${then}`,
           allLabel: `Stop all idle (${idle.length}), then ${then}` };
}

/** Show `offer` (from `offers`) in `box`, or clear it (null). */
export function showOffers(box, offer) {
  box.replaceChildren();
  box.hidden = !offer;
  if (!offer) return;
  const text = document.createElement("p");
  text.textContent = offer.some ? offer.text : `${offer.text} Stopping them all would still not free enough.`;
  const buttons = [];
  if (offer.some) buttons.push(["stop-some", offer.someLabel]);
  if (offer.some && offer.some.length < offer.all.length) buttons.push(["stop-all", offer.allLabel]);
  box.append(text, ...buttons.map(([action, label]) => {
    const b = document.createElement("button");
    b.type = "button";
    b.dataset.action = action;
    b.dataset.needsLive = "";
    b.textContent = label;
    return b;
  }));
}
