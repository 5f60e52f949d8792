// dgxmm's own log in the Events view: its latest lines (api/log), filtered by level and by words
// or a request id, newest first. Read when the view opens and on Refresh: an operator looks
// something up here; the live picture is on the other views.

import { api } from "./api.js";
import { cell } from "./activity.js";
import { timeElement } from "./format.js";

const form = document.getElementById("log-filters");
const body = document.getElementById("log-rows");
const empty = document.getElementById("log-empty");
const FIELD_NAMES = ["request_id", "deployment", "served_name", "peer"];

function row(line) {
  const tr = document.createElement("tr");
  tr.className = `log-${line.level}`;
  const message = document.createElement("pre");
  message.className = "log-message";
  message.textContent = line.message;
  const known = FIELD_NAMES.filter((k) => line[k]).map((k) => `${k}=${line[k]}`).join(" ");
  tr.append(cell("Time", timeElement(line.time)), cell("Level", line.level), cell("Logger", line.logger),
    cell("Line", message), cell("Request and deployment", known));
  return tr;
}

/** The lines the filters ask for, replacing the table. */
export async function loadLog() {
  const params = new URLSearchParams({ limit: "300" });
  const level = form.elements.level.value;
  const words = form.elements.q.value.trim();
  if (level) params.set("level", level);
  if (words) params.set("q", words);
  const lines = await api(`log?${params}`);
  body.replaceChildren(...lines.map(row));
  empty.hidden = lines.length > 0;
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  loadLog().catch(() => {});
});
form.elements.level.addEventListener("change", () => loadLog().catch(() => {}));
