// The host's memory: the bar of what each deployment holds now, and the chart of the last hour
// (from api/host/history) with what queued requests want as a hatched "wanted" band. A host
// with several devices has a bar and a chart per device (devicememory.js).

import { PALETTE_SIZE, bandLegend, dataTable, memoryChart, timeAxis } from "./charts.js";
import { devicePoints, renderDeviceBars, usableByDevice } from "./devicememory.js";
import { gpuText } from "./devices.js";
import { DEVICES, HOLDS_MEMORY, KIND_LABELS, STATE_LABELS, clock, gib, heldGib, memoryKind } from "./format.js";

/** A segment's size in words: the declaration, and what was measured when that is more (the
 * budget counts it then, so the segment is that large). */
function barText(v) {
  const measured = v.memory_measured_gib;
  return measured != null && measured > v.memory_gib
    ? `${gib(v.memory_gib)}, ${gib(measured)} measured` : gib(v.memory_gib);
}

const $ = (id) => document.getElementById(id);
const RANK = { system: 0, always: 1, ondemand: 2 };
const seen = { host: null, history: null }; // the latest of each, for the colours and the charts

/** The status without its count ("Serving", "Idle"): the bar is redrawn when the status changes,
 * not with every count. */
function phaseOf(v) {
  return v.status && v.status.label ? v.status.label.replace(/ \d+$/, "") : STATE_LABELS[v.state] || v.state;
}

/** A number from a deployment's id (FNV-1a): the colour it asks for. */
function hashOf(id) {
  let h = 0x811c9dc5;
  for (let i = 0; i < id.length; i += 1) h = Math.imul(h ^ id.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

/**
 * Each deployment's colour (`.c-N`), the same in every bar, chart and legend (issue 41 item 4):
 * the one its id asks for, or the next one no older deployment has (while the palette lasts).
 * Deployments are taken oldest first, then the ids only the history names (removed ones), so a
 * new deployment never changes another's colour.
 */
function colourMap(views) {
  const ids = [...views].sort((a, b) => a.created_at - b.created_at || a.id.localeCompare(b.id)).map((v) => v.id);
  const known = new Set(ids);
  const history = seen.history;
  const past = history ? [...new Set(history.points.flatMap((p) => Object.keys(p.held)))].sort() : [];
  const colours = new Map();
  let used = new Set();
  for (const id of [...ids, ...past.filter((id) => !known.has(id))]) {
    if (used.size === PALETTE_SIZE) used = new Set();
    let c = hashOf(id) % PALETTE_SIZE;
    while (used.has(c)) c = (c + 1) % PALETTE_SIZE;
    used.add(c);
    colours.set(id, c);
  }
  return (id) => (colours.has(id) ? colours.get(id) : hashOf(id) % PALETTE_SIZE);
}

/**
 * The order of the chart's bands: the chart's deployments (system, always on, on demand, then by
 * name), then those holding memory the history has not seen yet.
 */
function colourOrder(views) {
  const byId = new Map(views.map((v) => [v.id, v]));
  const history = seen.history;
  const nameOf = (id) => (byId.get(id) || {}).name || (history && history.names[id]) || id;
  const kindOf = (id) => (byId.has(id) ? memoryKind(byId.get(id)) : "ondemand");
  const sorted = (ids) => ids.sort((a, b) => RANK[kindOf(a)] - RANK[kindOf(b)] || nameOf(a).localeCompare(nameOf(b)));
  const charted = history ? sorted([...new Set(history.points.flatMap((p) => Object.keys(p.held)))]) : [];
  const more = sorted(views.filter((v) => HOLDS_MEMORY.has(v.state) && !charted.includes(v.id)).map((v) => v.id));
  return { ids: [...charted, ...more], nameOf, kindOf, colourOf: colourMap(views) };
}

/** A line in the legend: a swatch of `className` and `text` (the item of `itemClass`). */
function legendItem([className, text, itemClass]) {
  const item = document.createElement("li");
  if (itemClass) item.className = itemClass;
  const swatch = document.createElement("span");
  swatch.className = `swatch ${className}`;
  swatch.setAttribute("aria-hidden", "true");
  item.append(swatch, text);
  return item;
}

/** The bars of a host with several devices, with the summary and legend for all of them. */
function renderDevices(host, views, wanted) {
  const { colourOf } = colourOrder(views);
  const { items, held, free } = renderDeviceBars($("memory-devices"), host, views, colourOf, phaseOf);
  const mem = host.memory;
  $("memory-summary").textContent = `Usable memory ${gib(mem.usable_gib)} on ${DEVICES.length} GPUs (${mem.source}): `
    + `${gib(held)} held, ${gib(free)} free` + (wanted ? `, ${gib(wanted)} wanted by queued requests.` : ".");
  if (wanted) items.push(["seg-wanted", `Wanted by queued requests: ${gib(wanted)}`]);
  $("memory-legend").replaceChildren(...items.map(legendItem));
}

/**
 * The memory bar: the host's usable memory, one segment for each deployment that holds memory
 * (starting, ready, asleep or stopping), always-on and system ones first, then what is free.
 */
export function renderMemory(host, views) {
  const bar = $("memory-bar");
  const legend = $("memory-legend");
  const summary = $("memory-summary");
  if (!host) return;
  seen.host = host;
  const wanted = views.filter((v) => v.status && v.status.code === "queued").reduce((s, v) => s + v.memory_gib, 0);
  bar.hidden = DEVICES.length > 0;
  $("memory-devices").hidden = !DEVICES.length;
  if (DEVICES.length) {
    renderDevices(host, views, wanted);
    return;
  }
  const mem = host.memory;
  const holding = views
    .filter((v) => HOLDS_MEMORY.has(v.state))
    .sort((a, b) => RANK[memoryKind(a)] - RANK[memoryKind(b)] || a.name.localeCompare(b.name));
  const held = holding.reduce((sum, v) => sum + heldGib(v), 0);
  const fixed = holding.filter((v) => memoryKind(v) !== "ondemand").reduce((s, v) => s + heldGib(v), 0);
  const total = mem.usable_gib;
  const free = Math.max(0, total - held);
  // Measured sources (meminfo, nvml) may see memory used outside dgxmm.
  const other = mem.source === "declared" ? 0 : Math.max(0, Math.min(free, free - mem.free_gib));
  const scale = Math.max(total, held) || 1;

  const { colourOf } = colourOrder(views);
  const parts = holding.map((v) => ({
    kind: memoryKind(v), size: heldGib(v), label: v.name,
    colour: `seg-dev c-${colourOf(v.id)}${memoryKind(v) === "ondemand" ? "" : " seg-fixed"}`,
    text: `${v.name}: ${barText(v)}, ${KIND_LABELS[memoryKind(v)]}, ${phaseOf(v)}`,
  }));
  if (other > 0.005) parts.push({ kind: "other", size: other, label: "other", text: `Used outside dgxmm: ${gib(other)}` });
  parts.push({ kind: "free", size: free - other, label: "free", text: `Free: ${gib(free - other)}` });

  bar.replaceChildren(...parts.filter((p) => p.size > 0).map((p) => {
    const seg = document.createElement("span");
    seg.className = `seg seg-${p.kind}${p.colour ? ` ${p.colour}` : ""}`;
    seg.style.width = `${(p.size / scale) * 100}%`;
    seg.title = p.text;
    if (p.size / scale > 0.08) {
      const label = document.createElement("span");
      if (p.colour) label.className = "seg-label"; // legible on any of the colours
      label.textContent = p.label;
      seg.append(label);
    }
    return seg;
  }));
  const line = `${gib(held)} of ${gib(total)} held (${gib(fixed)} by always-on and system deployments), ${gib(free - other)} free`;
  bar.setAttribute("aria-label", `Memory: ${line}`);
  summary.textContent = `Usable memory ${gib(total)} (${mem.source}): ${gib(held)} held, ${gib(free - other)} free`
    + (wanted ? `, ${gib(wanted)} wanted by queued requests.` : ".");
  const items = parts.map((p) => [p.colour ? `seg-${p.kind} ${p.colour}` : `seg-${p.kind}`, p.text]);
  if (wanted) items.push(["seg-wanted", `Wanted by queued requests: ${gib(wanted)}`]);
  legend.replaceChildren(...items.map(legendItem));
}

/** One chart per device, each labelled with its device, from points split by device; null when
 * the history does not say where deployments were placed. */
function deviceCharts({ points, start, end, order, nameOf, kindOf, colourOf }) {
  const usable = usableByDevice(seen.host);
  const charts = [];
  for (const device of DEVICES) {
    const split = devicePoints(points, device.index, usable.get(device.index));
    if (!split) return null;
    const box = document.createElement("div");
    box.className = "devchart";
    const label = document.createElement("p");
    label.className = "devchart-label";
    label.textContent = `GPU ${device.index}`;
    const last = split[split.length - 1];
    const now = Object.entries(last.held).map(([id, g]) => `${nameOf(id)} ${gib(g)}`).join(", ");
    const svg = memoryChart({ points: split, start, end, order, nameOf, kindOf, colourOf });
    svg.setAttribute("aria-label", `GPU ${device.index}: now ${now || "nothing"} held of ${gib(last.usable_gib)}.`);
    box.append(label, svg);
    charts.push(box);
  }
  return charts;
}

/** The chart of the last hour (one per device on a host with several), with its caption and
 * its numbers as a table. */
export function renderMemoryHistory(history, views) {
  const figure = $("memory-history");
  seen.history = history;
  if (!history || !history.points.length) {
    figure.replaceChildren();
    return;
  }
  // The last hour, or since the first point when dgxmm has not run that long.
  const end = Date.now() / 1000;
  const start = Math.max(end - history.window_s, Math.min(history.points[0].time, end - 60));
  const since = start > end - history.window_s + 1 ? `since ${clock(start)}` : "over the last hour";
  const { ids, nameOf, kindOf, colourOf } = colourOrder(views);
  const points = history.points;
  const last = points[points.length - 1];
  const heldNow = Object.values(last.held).reduce((a, b) => a + b, 0);
  let peak = { total: -1, time: 0 };
  for (const p of points) {
    const total = Object.values(p.held).reduce((a, b) => a + b, 0);
    if (p.time >= start && total > peak.total) peak = { total, time: p.time };
  }
  const nowParts = Object.entries(last.held).map(([id, g]) => `${nameOf(id)} ${gib(g)}`).join(", ");
  const summary = `Memory ${since}: now ${gib(heldNow)} held of ${gib(last.usable_gib)}`
    + `${nowParts ? ` (${nowParts})` : ""}${last.wanted_gib ? `, ${gib(last.wanted_gib)} wanted by queued requests` : ""}`
    + `${peak.total >= 0 ? `; the most held was ${gib(peak.total)} at ${clock(peak.time)}` : ""}.`;
  const chart = { points, start, end, order: ids, nameOf, kindOf, colourOf };
  const perDevice = DEVICES.length && seen.host ? deviceCharts(chart) : null;
  let drawing;
  if (perDevice) {
    drawing = perDevice;
  } else {
    const svg = memoryChart(chart);
    svg.setAttribute("aria-label", summary);
    drawing = [svg];
  }
  const caption = document.createElement("figcaption");
  caption.textContent = summary;
  const drawn = new Set(ids.filter((id) => points.some((p) => p.held[id] > 0))); // (as memoryChart draws)
  const where = (p, id) => (perDevice && p.placed[id] && p.placed[id].length ? ` on ${gpuText(p.placed[id])}` : "");
  const rows = points.filter((p) => p.time >= start).slice(-30).reverse().map((p) => [
    clock(p.time),
    Object.entries(p.held).map(([id, g]) => `${nameOf(id)} ${gib(g)}${where(p, id)}`).join(", ") || "nothing",
    gib(p.wanted_gib),
  ]);
  figure.replaceChildren(caption, ...drawing, timeAxis(start, end, clock), bandLegend(ids, nameOf, drawn, colourOf),
    dataTable(`Memory changes ${since} (newest first)`, ["Time", "Held", "Wanted"], rows));
}
