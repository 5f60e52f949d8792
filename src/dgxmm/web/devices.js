// A host with several devices (GPUs, docs/engines.md#several-gpus): which devices a deployment
// holds memory on, its devices in words, and what each device has room for, as the server's
// budget counts them. A pooled host (one device) has none of this: DEVICES stays empty.

import { DEVICES, HOLDS_MEMORY, gib, heldGib, memoryKind } from "./format.js";

/** "GPU 1", "GPUs 0, 1". */
export function gpuText(ids) {
  return `${ids.length === 1 ? "GPU" : "GPUs"} ${ids.join(", ")}`;
}

/** How many devices the engine spans (its `gpus`; one when unset, 0 for no GPU). */
export function spanOf(view) {
  return view.gpus == null ? 1 : Number(view.gpus);
}

/** A deployment's devices for its card and row ("" on a pooled host): where it holds memory,
 * else its pins, else how many it will take. */
export function devicesText(view) {
  if (!DEVICES.length) return "";
  const span = spanOf(view);
  if (span === 0) return "None (it uses no GPU)";
  if (!view.gpu_ids) return span === 1 ? "Any GPU" : `Any ${span} GPUs`;
  const pinned = view.gpu_pins && !HOLDS_MEMORY.has(view.state) ? ", pinned" : "";
  return gpuText(view.gpu_ids) + pinned;
}

/** Where a deployment holding memory holds it (the budget's devices_of): its devices, else the
 * first ones, as CUDA places an engine told nothing. */
export function devicesOf(view) {
  const span = spanOf(view);
  if (span === 0) return [];
  const present = DEVICES.map((d) => d.index);
  const given = view.gpu_ids;
  if (given && given.every((d) => present.includes(d))) return given;
  return present.slice(0, span);
}

/**
 * Each device as the fit check sees it: {index, name, total, usable, held, free, capacity, parts}
 * where `parts` are [view, GiB] of the deployments holding memory there. Usable is the server's
 * figure (the device less its reserve, or what NVML reads); capacity is what on-demand models can
 * ever get there.
 */
export function deviceRooms(host, views) {
  const reserve = (DEVICES.reduce((s, d) => s + d.total_gib, 0) - host.memory.usable_gib) / DEVICES.length;
  const rooms = DEVICES.map((d) => ({
    index: d.index, name: d.name, total: d.total_gib, usable: d.usable_gib ?? d.total_gib - reserve, fixed: 0, parts: [],
    held: d.held_gib, free: d.free_gib,
  }));
  const byIndex = new Map(rooms.map((r) => [r.index, r]));
  for (const view of views.filter((v) => HOLDS_MEMORY.has(v.state))) {
    const where = devicesOf(view).filter((d) => byIndex.has(d));
    for (const index of where) {
      const room = byIndex.get(index);
      const share = heldGib(view) / where.length;
      room.parts.push([view, share]);
      if (memoryKind(view) !== "ondemand") room.fixed += share;
    }
  }
  for (const room of rooms) room.capacity = room.usable - room.fixed;
  return rooms;
}

/**
 * Whether `memory` GiB over `span` devices (of `pins`, when given) fits: "now" (enough free on
 * as many devices), "wait" (on-demand models can get it there once others stop), or "never";
 * with the share it needs on each device and what the devices give, for the sentence.
 */
export function deviceFit(rooms, memory, span, pins, onDemand) {
  const allowed = pins && pins.length ? rooms.filter((r) => pins.includes(r.index)) : rooms;
  const share = memory / span;
  const kth = (key) => allowed.map((r) => r[key]).sort((a, b) => b - a)[span - 1] ?? 0;
  const free = kth("free");
  const most = kth(onDemand ? "capacity" : "usable");
  const verdict = share <= free + 1e-9 ? "now" : share <= most + 1e-9 ? "wait" : "never";
  return { verdict, share, free, most, pinned: allowed !== rooms };
}

/** "needs 90 GiB on one device; the largest device gives 80 GiB". */
export function shareText({ share, most, pinned }, span) {
  const which = pinned ? "pinned device" : "device";
  return span === 1
    ? `needs ${gib(share)} on one device; the largest ${which} gives ${gib(most)}`
    : `needs ${gib(share)} on each of ${span} devices; ${span} ${which}s give at most ${gib(most)} each`;
}
