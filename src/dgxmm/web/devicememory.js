// The memory of a host with several devices: one bar per device with what each deployment holds
// there (a deployment spanning two is on both, its memory split evenly, as the budget counts it),
// and the last hour's points split by device for one chart per device. Each deployment has the
// colour the chart gives it (`.c-N`, from `colourOf`), in every bar and chart.

import { gpuText, deviceRooms, devicesOf } from "./devices.js";
import { HOLDS_MEMORY, KIND_LABELS, gib, heldGib, memoryKind } from "./format.js";

function el(name, text, className) {
  const node = document.createElement(name);
  if (text != null) node.textContent = text;
  if (className) node.className = className;
  return node;
}

function segment(className, size, scale, title, label) {
  const seg = el("span", null, `seg ${className}`);
  seg.style.width = `${(size / scale) * 100}%`;
  seg.title = title;
  if (label && size / scale > 0.12) seg.append(el("span", label, "seg-label"));
  return seg;
}

/** One device's line: its name, what is held and free in words, and its bar. */
function deviceBar(room, measured, colourOf, phaseOf) {
  const scale = Math.max(room.usable, room.parts.reduce((s, [, g]) => s + g, 0)) || 1;
  const held = room.parts.reduce((s, [, g]) => s + g, 0);
  const byDeclaration = Math.max(0, room.usable - held);
  // A measured source (nvml) may see memory used outside dgxmm on the device.
  const other = measured && room.free != null ? Math.max(0, Math.min(byDeclaration, byDeclaration - room.free)) : 0;
  const free = byDeclaration - other;
  const name = `GPU ${room.index}`;
  const segs = room.parts.map(([view, share]) => segment(
    `seg-dev c-${colourOf(view.id)}${memoryKind(view) === "ondemand" ? "" : " seg-fixed"}`, share, scale,
    `${view.name}: ${gib(share)} on ${name}, ${KIND_LABELS[memoryKind(view)]}, ${phaseOf(view)}`, view.name));
  if (other > 0.005) segs.push(segment("seg-other", other, scale, `Used outside dgxmm: ${gib(other)}`, "other"));
  if (free > 0) segs.push(segment("seg-free", free, scale, `Free: ${gib(free)}`, "free"));
  const words = `${gib(held)} of ${gib(room.usable)} held, ${gib(free)} free`;
  const box = el("div", null, "devbar");
  const label = el("p", null, "devbar-label");
  const sized = room.name && room.name !== `device ${room.index}` ? ` (${room.name})` : "";
  label.append(el("strong", name + sized), el("span", ` ${words}`, "devbar-words"));
  const bar = el("div", null, "membar");
  bar.setAttribute("role", "img");
  bar.setAttribute("aria-label", `${name}: ${words}${room.parts.length ? ` (${room.parts.map(([v, g]) => `${v.name} ${gib(g)}`).join(", ")})` : ""}`);
  bar.replaceChildren(...segs);
  const short = el("span", `${gib(free)} free`, "devbar-free"); // a phone's line, where the words are hidden
  short.setAttribute("aria-hidden", "true");
  box.append(label, bar, short);
  return { box, held, free, other };
}

/**
 * The device bars in `container`, and the legend's items ([swatch class, text]): each deployment
 * holding memory once, with the devices it holds it on, then free and other memory.
 */
export function renderDeviceBars(container, host, views, colourOf, phaseOf) {
  const rooms = deviceRooms(host, views);
  const measured = host.memory.source !== "declared";
  const drawn = rooms.map((room) => deviceBar(room, measured, colourOf, phaseOf));
  container.replaceChildren(...drawn.map((d) => d.box));
  const holding = views.filter((v) => HOLDS_MEMORY.has(v.state));
  const items = holding.map((v) => {
    const where = devicesOf(v);
    const place = where.length ? `on ${gpuText(where)}` : "on no GPU";
    return [`seg-dev c-${colourOf(v.id)}${memoryKind(v) === "ondemand" ? "" : " seg-fixed"}`,
      `${v.name}: ${gib(heldGib(v))} ${place}, ${KIND_LABELS[memoryKind(v)]}, ${phaseOf(v)}`];
  });
  const other = drawn.reduce((s, d) => s + d.other, 0);
  if (other > 0.005) items.push(["seg-other", `Used outside dgxmm: ${gib(other)}`]);
  items.push(["seg-free", `Free: ${drawn.map((d, i) => `${gib(d.free)} on GPU ${rooms[i].index}`).join(", ")}`, "legend-free"]);
  return { items, held: drawn.reduce((s, d) => s + d.held, 0), free: drawn.reduce((s, d) => s + d.free, 0) };
}

/**
 * The history's points as one device saw them: what each deployment held there (its memory
 * split over the devices it was placed on, `placed` of each point) and the device's usable
 * memory. Null when the points do not say where deployments were placed.
 */
export function devicePoints(points, index, usable) {
  if (!points.every((p) => p.placed)) return null;
  return points.map((p) => {
    const held = {};
    for (const [id, g] of Object.entries(p.held)) {
      const where = p.placed[id] || [];
      if (where.includes(index)) held[id] = g / where.length;
    }
    return { time: p.time, usable_gib: usable, held, wanted_gib: 0 };
  });
}

/** The devices' usable memory by index (each device less the server's reserve). */
export function usableByDevice(host) {
  return new Map(deviceRooms(host, []).map((r) => [r.index, r.usable]));
}
