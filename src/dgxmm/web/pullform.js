// The Models view's pull form: a repository's files and sizes listed before the pull (GET
// api/models/files), filtered live by the patterns as the pull will apply them, with the total,
// what is here already, and whether it fits the model store's free disk; then POST api/models.

import { api } from "./api.js";
import { clearErrors, reportProblems, showApiError, showFieldError, submitting } from "./forms.js";
import { gib } from "./format.js";
import { REPO, listFiles, matching, sizeText, splitGlobs } from "./hubfiles.js";

const GIB = 1024 ** 3;
const form = document.getElementById("pull-form");
const f = form.elements;
const $ = (id) => document.getElementById(id);
let listing = null; // the answer for the repository and revision in the form, or null
let serverFilter = null; // for a truncated listing: the server's answer for the patterns now
let asked = 0;
let hooks = { disk: () => null, pulled: () => {} };

function wanted() {
  return { repo: f.repo.value.trim(), revision: f.revision.value.trim() || "main", include: splitGlobs(f.include.value) };
}

function problemsOf(w) {
  const problems = [];
  if (!w.repo) problems.push(["repo", "Enter the repository as ORG/REPO, e.g. Qwen/Qwen3-8B-GGUF."]);
  else if (!REPO.test(w.repo) || w.repo.includes("..")) {
    problems.push(["repo", `“${w.repo}” is not a repository: write ORG/REPO (letters, digits, “.”, “_” or “-” on each side of one “/”).`]);
  }
  return problems;
}

/** What the patterns keep of the listing: counts and sizes, and the rows to show. */
function kept() {
  const globs = splitGlobs(f.include.value);
  if (listing.truncated) {
    const answer = serverFilter && serverFilter.include.join(" ") === globs.join(" ") ? serverFilter : listing;
    return { files: answer.files, matched: answer.matched, bytes: answer.bytes_matched, here: answer.bytes_here, cut: answer.truncated };
  }
  const files = matching(listing.files, globs);
  const sum = (list) => list.reduce((total, file) => total + file.size, 0);
  return { files, matched: files.length, bytes: sum(files), here: sum(files.filter((file) => file.here)), cut: false };
}

function fitText(toFetch) {
  const disk = hooks.disk();
  if (!disk) return { text: "", fits: true };
  const room = (disk.free_gib - disk.reserve_gib) * GIB;
  const fits = toFetch <= room;
  const free = `${gib(disk.free_gib)} free on the models' disk, ${gib(disk.reserve_gib)} of it kept free`;
  return fits ? { text: ` ${free}: it fits.`, fits }
    : { text: ` ⚠ Too little space: ${free}. The pull would fail (insufficient_storage).`, fits };
}

function render() {
  const box = $("pull-files-box");
  const warning = $("pull-warning");
  if (!listing) {
    box.hidden = true;
    warning.hidden = true;
    return;
  }
  warning.hidden = !listing.warning;
  warning.textContent = listing.warning || "";
  const k = kept();
  const globs = splitGlobs(f.include.value);
  const toFetch = k.bytes - k.here;
  const count = listing.file_count;
  const of = globs.length ? `${k.matched} of ${count} files match` : `${count} file${count === 1 ? "" : "s"}`;
  const here = k.here ? ` (${sizeText(k.here)} in the store already, ${sizeText(toFetch)} to download)` : "";
  const fit = fitText(toFetch);
  $("pull-summary").textContent = `${listing.repo}@${listing.revision}: ${of}, ${sizeText(k.bytes)}${here}.${fit.text}`;
  $("pull-summary").classList.toggle("warning", !fit.fits);
  $("pull-files-caption").textContent = `Files of ${listing.repo} the pull fetches`;
  const rows = k.files.map((file) => {
    const tr = document.createElement("tr");
    for (const [label, text] of [["File", file.path], ["Size", sizeText(file.size)], ["In the store", file.here ? "Yes" : "No"]]) {
      const td = document.createElement("td");
      td.dataset.label = label;
      td.textContent = text;
      tr.append(td);
    }
    return tr;
  });
  if (k.cut || k.files.length < k.matched) {
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    td.colSpan = 3;
    td.textContent = `The first ${k.files.length} of ${k.matched} are listed; the sizes above count them all.`;
    tr.append(td);
    rows.push(tr);
  }
  $("pull-files").replaceChildren(...rows);
  box.hidden = false;
}

async function list() {
  clearErrors(form);
  const w = wanted();
  if (reportProblems(form, problemsOf(w))) return;
  const ask = ++asked;
  $("pull-summary").textContent = `Asking the hub for the files of ${w.repo}…`;
  try {
    const answer = await listFiles(w.repo, w.revision);
    if (ask !== asked) return;
    listing = answer;
    serverFilter = null;
    render();
    if (listing.truncated && w.include.length) filterOnServer();
  } catch (error) {
    if (ask !== asked) return;
    listing = null;
    render();
    $("pull-summary").textContent = "";
    if ([401, 403, 404].includes(error.status)) error.field = error.code === "revision_not_found" ? "revision" : "repo";
    showApiError(form, error);
  }
}

/** A listing cut at its first files: the server applies the patterns to all of them. */
let filterTimer = null;
function filterOnServer() {
  clearTimeout(filterTimer);
  filterTimer = setTimeout(async () => {
    const w = wanted();
    try {
      serverFilter = await listFiles(listing.repo, listing.revision, w.include);
      render();
    } catch {
      // the next change asks again
    }
  }, 300);
}

$("pull-list").addEventListener("click", () => list());

f.include.addEventListener("input", () => {
  if (!listing) return;
  render();
  if (listing.truncated) filterOnServer();
});
for (const input of [f.repo, f.revision]) {
  input.addEventListener("input", () => { // another repository: the listing shown is not its
    asked++;
    listing = null;
    $("pull-summary").textContent = "";
    render();
  });
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  if (!listing) { // (Enter in a field, or Pull before List files) the files first, then a second Pull
    await list();
    if (listing) $("pull-summary").textContent += " Press Pull to download them.";
    return;
  }
  clearErrors(form);
  const w = wanted();
  const problems = problemsOf(w);
  if (listing && !problems.length && kept().matched === 0) {
    problems.push(["include", `${w.include.join(" ")} matches none of the ${listing.file_count} files of ${listing.repo}: change the patterns, or leave them empty for every file.`]);
  }
  if (reportProblems(form, problems)) return;
  await submitting(form, async () => {
    try {
      const answer = await api("models", { method: "POST", body: w });
      hooks.pulled(answer, answer.status === "ready"); // (ready at once: it was all here, 200)
      if (answer.status === "failed") showFieldError(form, "form", `The pull failed: ${answer.error}`);
    } catch (error) {
      showApiError(form, error);
    }
  });
});

/** Wire the form: `disk()` is the model store's disk now, `pulled(record, already)` shows an
 * answered pull. */
export function wirePullForm(given) {
  hooks = given;
}
