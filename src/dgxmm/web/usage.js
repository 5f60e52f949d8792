// Usage per model and per caller key (GET api/activity/usage): requests, prompt and completion
// tokens and errors today (the UTC day) and in the last hour, each request counted as it ends.
// The requests view's two tables and its key filter's names come from here, and the words the
// keys view and a model's detail view use for a usage entry.

import { api } from "./api.js";
import { cell } from "./activity.js";
import { clock } from "./format.js";

const $ = (id) => document.getElementById(id);
if (matchMedia("(max-width: 40rem)").matches) $("usage-box").open = false; // a phone: the requests first
const count = (value) => Number(value || 0).toLocaleString("en");
const counted = (n, one) => `${count(n)} ${n === 1 ? one : `${one}s`}`;

/** Prompt → completion tokens: "1,530 → 2,874". */
export function tokensText(u) {
  return `${count(u.prompt_tokens)} → ${count(u.completion_tokens)}`;
}

/** A usage entry in words: "3 requests, 120 → 48 tokens, 1 error". */
export function usageText(u) {
  return `${counted(u.requests, "request")}, ${tokensText(u)} tokens, ${u.errors ? counted(u.errors, "error") : "no errors"}`;
}

function rows(body, label, entries) {
  body.replaceChildren(...entries.map(({ name, today, last_hour: hour }) => {
    const tr = document.createElement("tr");
    tr.dataset.name = name;
    tr.append(cell(label, name), cell("Requests today", count(today.requests)),
      cell("Tokens today (in → out)", tokensText(today)), cell("Errors today", count(today.errors)),
      cell("Requests, last hour", count(hour.requests)), cell("Tokens, last hour", tokensText(hour)),
      cell("Errors, last hour", count(hour.errors)));
    return tr;
  }));
}

/** The requests view's usage tables, read again; resolves to the keys' names, the key file's first. */
export async function loadUsage() {
  const usage = await api("activity/usage");
  rows($("usage-models"), "Model", usage.models);
  rows($("usage-keys"), "Key", usage.keys);
  $("usage-since").textContent = "Each request counts as it ends; today is the UTC day. The models' and the key "
    + `file's figures and every last hour are counted since dgxmm started (${clock(usage.counted_since)}); `
    + "a caller key's today outlives a restart.";
  return usage.keys.map((key) => key.name);
}
