// Problems first (issue 58): the deployments that need someone (failed, waiting for memory, or
// refusing their requests because they can never fit) are counted in the header and in the page's
// title, so a failure is seen from another tab, and ranked first in the overview's default order
// (toolbar.js), so with 40 deployments it is not five screens down.

const $ = (id) => document.getElementById(id);
const OVERVIEW = "Deployments · dgxmm";
let base = "dgxmm"; // the title of the view shown, e.g. "Requests · dgxmm"
let counted = ""; // "1 failed · 2 waiting", or "" when nothing needs anyone

/** What needs someone in `view` now: "failed", "waiting" (queued for memory), "refusing" (too big
 * to ever fit: its requests are refused), or "" (nothing). */
function problemOf(view) {
  const status = view.status || {};
  const code = status.code || view.state;
  if (code === "failed") return "failed";
  if (code === "queued") return "waiting";
  if (code === "too_big" || status.never_fits) return "refusing";
  return "";
}

const RANK = { failed: 0, waiting: 1, refusing: 2, "": 3 };

/** 0 for a failed deployment, then waiting, then refusing, 3 for one that needs nobody. */
export function problemRank(view) {
  return RANK[problemOf(view)];
}

/** "1 failed · 2 waiting" for `views`, in the order of urgency; "" when none needs anyone. */
function problemsText(views) {
  const counts = { failed: 0, waiting: 0, refusing: 0 };
  for (const view of views) {
    const problem = problemOf(view);
    if (problem) counts[problem] += 1;
  }
  return Object.entries(counts).filter(([, n]) => n).map(([what, n]) => `${n} ${what}`).join(" · ");
}

function paintTitle() {
  // On the overview the counts are the news: "1 failed · 2 waiting — dgxmm".
  document.title = counted ? `${counted} — ${base === OVERVIEW ? "dgxmm" : base}` : base;
}

/** The counts of `views` in the header (a link to the overview) and in the title. */
export function showProblems(views) {
  counted = problemsText(views);
  const link = $("problems");
  link.textContent = counted;
  link.hidden = !counted;
  paintTitle();
}

/** The title of the view shown ("Requests · dgxmm"); the counts go before it. */
export function setTitle(title) {
  base = title;
  paintTitle();
}
