// Small charts drawn as plain SVG by dgxmm's own code: sparklines, bars, and a stacked step chart
// of memory over time. Each comes with its text equivalent: a summary (the figure's caption and
// the SVG's label) and the numbers as a table in a <details>.

const SVG = "http://www.w3.org/2000/svg";

function svgEl(name, attrs = {}) {
  const el = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, String(value));
  return el;
}

function el(name, text, className) {
  const node = document.createElement(name);
  if (text != null) node.textContent = text;
  if (className) node.className = className;
  return node;
}

/** A <details> with a table: the chart's numbers for people who cannot see it. */
export function dataTable(summary, headers, rows) {
  const details = el("details", null, "chart-data");
  details.append(el("summary", summary));
  const table = el("table", null, "rows compact");
  const head = el("tr");
  for (const h of headers) {
    const th = el("th", h);
    th.scope = "col";
    head.append(th);
  }
  const thead = el("thead");
  thead.append(head);
  const tbody = el("tbody");
  for (const row of rows) {
    const tr = el("tr");
    row.forEach((cell, i) => {
      const td = el("td", cell);
      td.dataset.label = headers[i];
      tr.append(td);
    });
    tbody.append(tr);
  }
  table.append(thead, tbody);
  details.append(table);
  return details;
}

function fmt(value) {
  return Number.isInteger(value) ? String(value) : Number(value).toFixed(1);
}

/**
 * A sparkline of `values` (oldest first) in a <figure>: `title`, `labels` (one per value, for
 * the table), `unit` for the summary. The SVG is 100 wide and 24 high, scaled by CSS.
 */
export function sparkline({ title, values, labels, unit = "", current = null }) {
  const figure = el("figure", null, "spark");
  const max = Math.max(1, ...values);
  const peak = Math.max(0, ...values);
  // `current`: the count this moment, where the series holds each minute's peak (in flight, queued)
  const now = current != null ? current : values.length ? values[values.length - 1] : 0;
  const summary = `${title}: ${fmt(now)}${unit} now, at most ${fmt(peak)}${unit} in the last hour.`;
  const svg = svgEl("svg", { viewBox: "0 0 100 24", preserveAspectRatio: "none", role: "img", "aria-label": summary });
  const step = values.length > 1 ? 100 / (values.length - 1) : 100;
  const y = (v) => (22 - (v / max) * 20).toFixed(2);
  const line = values.map((v, i) => `${(i * step).toFixed(2)},${y(v)}`).join(" ");
  svg.append(svgEl("polygon", { points: `0,24 ${line} 100,24`, class: "spark-area" }));
  svg.append(svgEl("polyline", { points: line, class: "spark-line", "vector-effect": "non-scaling-stroke" }));
  const caption = el("figcaption");
  caption.append(el("span", title, "spark-title"), el("span", `${fmt(now)}${unit} now · peak ${fmt(peak)}${unit}`, "spark-value"));
  figure.append(caption, svg, dataTable(`${title}: the numbers`, ["Minute", title],
    values.map((v, i) => [labels[i], fmt(v)]).filter((row, i) => values[i] !== 0 || i === values.length - 1)));
  return figure;
}

/** Vertical bars, e.g. the last cold starts' durations: items of {label, value, kind}. */
export function bars({ title, items, unit = "" }) {
  const figure = el("figure", null, "spark bars");
  const max = Math.max(1, ...items.map((i) => i.value));
  const values = items.map((i) => i.value);
  const failed = items.filter((i) => i.kind === "failed").length;
  const summary = items.length
    ? `${title}: ${items.length}${failed ? ` (${failed} failed)` : ""}, the last ${fmt(values[values.length - 1])}${unit}, `
      + `the longest ${fmt(Math.max(...values))}${unit}.`
    : `${title}: none yet.`;
  const svg = svgEl("svg", { viewBox: "0 0 100 24", preserveAspectRatio: "none", role: "img", "aria-label": summary });
  const width = 100 / Math.max(items.length, 10);
  items.forEach((item, i) => {
    const h = Math.max(1, (item.value / max) * 22);
    svg.append(svgEl("rect", { x: (i * width + width * 0.15).toFixed(2), y: (24 - h).toFixed(2),
      width: (width * 0.7).toFixed(2), height: h.toFixed(2), class: `bar bar-${item.kind}` }));
  });
  const caption = el("figcaption");
  caption.append(el("span", title, "spark-title"), el("span", summary.slice(title.length + 2), "spark-value"));
  figure.append(caption, svg, dataTable(`${title}: the numbers`, ["When", "Kind", "Took"],
    items.map((i) => [i.label, i.kind, `${fmt(i.value)}${unit}`])));
  return figure;
}

/** How many colours the memory chart tells apart before one comes back (views.css, .c-N). */
export const PALETTE_SIZE = 8;

/**
 * Memory over time: stacked steps, one band per deployment (in `order`, each in its colour
 * `.c-N` from `colourOf`), then what queued requests want, hatched, on top; a line
 * at the usable memory. `points` are {time, usable_gib, held: {id: GiB}, wanted_gib}, oldest
 * first; the chart spans [start, end].
 */
export function memoryChart({ points, start, end, order, nameOf, kindOf, colourOf }) {
  const W = 600;
  const H = 120;
  const top = Math.max(1, ...points.map((p) => Math.max(p.usable_gib,
    Object.values(p.held).reduce((a, b) => a + b, 0) + p.wanted_gib)));
  const x = (t) => (((Math.max(t, start) - start) / (end - start)) * W).toFixed(1);
  const y = (v) => (H - (v / top) * (H - 4)).toFixed(1);
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img", class: "memchart" });
  const defs = svgEl("defs");
  const pattern = svgEl("pattern", { id: "wanted-hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse",
    patternTransform: "rotate(45)" });
  pattern.append(svgEl("rect", { width: 6, height: 6, class: "hatch-bg" }), svgEl("line", { x1: 0, y1: 0, x2: 0, y2: 6, class: "hatch-line" }));
  defs.append(pattern);
  svg.append(defs);
  const series = [...order.map((id) => ({ id, value: (p) => p.held[id] || 0, kind: kindOf(id) })),
    { id: "wanted", value: (p) => p.wanted_gib, kind: "wanted" }];
  const steps = points.map((p, i) => ({ p, from: p.time, to: i + 1 < points.length ? points[i + 1].time : end }));
  const base = steps.map(() => 0);
  series.forEach((s) => {
    const upper = [];
    const lower = [];
    steps.forEach((st, i) => {
      const v = s.value(st.p);
      lower.push(`${x(st.from)},${y(base[i])}`, `${x(st.to)},${y(base[i])}`);
      base[i] += v;
      upper.push(`${x(st.from)},${y(base[i])}`, `${x(st.to)},${y(base[i])}`);
    });
    if (!steps.some((st) => s.value(st.p) > 0)) return;
    const band = svgEl("polygon", { points: [...upper, ...lower.reverse()].join(" "),
      class: `band band-${s.kind}${s.kind === "wanted" ? "" : ` c-${colourOf(s.id)}`}` });
    band.append(svgEl("title"));
    band.firstChild.textContent = s.id === "wanted" ? "Wanted by queued requests" : nameOf(s.id);
    svg.append(band);
  });
  const usable = steps.map((st) => `${x(st.from)},${y(st.p.usable_gib)} ${x(st.to)},${y(st.p.usable_gib)}`).join(" ");
  if (usable) svg.append(svgEl("polyline", { points: usable, class: "usable-line", "vector-effect": "non-scaling-stroke" }));
  return svg;
}

/** The time axis under a chart spanning [start, end]: five times, the last "now" (HTML, so
 * the labels keep their shape whatever the chart's width). `clock` formats a Unix time. */
export function timeAxis(start, end, clock) {
  const axis = el("div", null, "time-axis");
  axis.setAttribute("aria-hidden", "true"); // the caption and the table say the times
  for (let i = 0; i <= 4; i += 1) axis.append(el("span", i === 4 ? "now" : clock(start + ((end - start) * i) / 4)));
  return axis;
}

/** A legend of the chart's bands: the colour of each deployment in `drawn` (`.c-N` from
 * `colourOf`, as `memoryChart` colours it). */
export function bandLegend(order, nameOf, drawn, colourOf) {
  const list = el("ul", null, "legend chart-legend");
  order.forEach((id) => {
    if (!drawn.has(id)) return;
    const item = el("li");
    const swatch = el("span", null, `swatch band-swatch c-${colourOf(id)}`);
    swatch.setAttribute("aria-hidden", "true");
    item.append(swatch, nameOf(id));
    list.append(item);
  });
  return list;
}
