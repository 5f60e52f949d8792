// A repository's files on the hub, for the Models view and the deploy wizard: the listing of
// GET api/models/files, include globs matched exactly as the server matches them (Python's
// fnmatch.fnmatchcase, whose translate() is ported here), sizes in words, and the hf:// name a
// deployment gives a pulled model.

import { api } from "./api.js";

// The Hub's rule for ORG/REPO, as the API checks it (modelstore/layout.py REPO_PATTERN).
export const REPO = /^[A-Za-z0-9][A-Za-z0-9._-]{0,95}\/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$/;

/** Ask dgxmm for `repo`'s files at `revision` (the hub's refusal keeps its status: 404, 401). */
export function listFiles(repo, revision, include = []) {
  const query = new URLSearchParams({ repo, revision });
  for (const glob of include) query.append("include", glob);
  // quiet401: a 401 here is the hub's (a private repository), not this page's token.
  return api(`models/files?${query}`, { quiet401: true });
}

/** The globs a field holds: separated by commas or spaces. */
export function splitGlobs(text) {
  return text.split(/[\s,]+/).filter(Boolean);
}

const SPECIAL = /[.*+?^${}()|[\]\\/-]/g;

/** A character class of fnmatch's `[...]`, `stuff` being what is between the brackets (its
 * hyphens and backslashes handled as Python's translate() handles them). */
function charClass(pat, i, j) {
  let stuff;
  if (!pat.slice(i, j).includes("-")) {
    stuff = pat.slice(i, j).replace(/\\/g, "\\\\");
  } else {
    const chunks = [];
    let k = pat[i] === "!" ? i + 2 : i + 1;
    for (;;) {
      k = pat.indexOf("-", k);
      if (k < 0 || k >= j) break;
      chunks.push(pat.slice(i, k));
      i = k + 1;
      k += 3;
    }
    const chunk = pat.slice(i, j);
    if (chunk) chunks.push(chunk);
    else chunks[chunks.length - 1] += "-";
    for (let m = chunks.length - 1; m > 0; m--) { // empty ranges (z-a) are dropped, as Python does
      if (chunks[m - 1].slice(-1) > chunks[m][0]) {
        chunks[m - 1] = chunks[m - 1].slice(0, -1) + chunks[m].slice(1);
        chunks.splice(m, 1);
      }
    }
    stuff = chunks.map((s) => s.replace(/\\/g, "\\\\").replace(/-/g, "\\-")).join("-");
  }
  stuff = stuff.replace(/([&~|])/g, "\\$1").replace(/]/g, "\\]"); // (a "]" first in it: JS would end the class)
  if (!stuff) return "(?!)"; // an empty class matches nothing
  if (stuff === "!") return "."; // a negated empty one any character
  if (stuff[0] === "!") stuff = `^${stuff.slice(1)}`;
  else if (stuff[0] === "^" || stuff[0] === "[") stuff = `\\${stuff}`;
  return `[${stuff}]`;
}

/** The regular expression of one glob, as fnmatch.translate makes it: `*` crosses "/", `?` is
 * one character, `[...]` a class (`[!...]` negated), the whole path matched, case kept. */
export function globRegExp(glob) {
  let out = "";
  let i = 0;
  while (i < glob.length) {
    const c = glob[i++];
    if (c === "*") {
      if (!out.endsWith(".*")) out += ".*";
    } else if (c === "?") {
      out += ".";
    } else if (c === "[") {
      let j = i;
      if (glob[j] === "!") j++;
      if (glob[j] === "]") j++;
      while (j < glob.length && glob[j] !== "]") j++;
      if (j >= glob.length) out += "\\[";
      else {
        out += charClass(glob, i, j);
        i = j + 1;
      }
    } else {
      out += c.replace(SPECIAL, "\\$&");
    }
  }
  return new RegExp(`^(?:${out})$`, "s");
}

/** The files any of `globs` matches (every file without globs), as a pull's include picks them. */
export function matching(files, globs) {
  if (!globs.length) return files;
  const patterns = globs.map(globRegExp);
  return files.filter((f) => patterns.some((re) => re.test(f.path)));
}

/** A size in bytes as people read it: "23 bytes", "12.5 KiB", "812 MiB", "4.58 GiB". */
export function sizeText(bytes) {
  const n = Number(bytes);
  if (n < 1024) return `${n} byte${n === 1 ? "" : "s"}`;
  const [unit, value] = n < 1024 ** 2 ? ["KiB", n / 1024] : n < 1024 ** 3 ? ["MiB", n / 1024 ** 2] : ["GiB", n / 1024 ** 3];
  return `${Number(value.toFixed(value < 10 ? 2 : value < 100 ? 1 : 0))} ${unit}`;
}

/** The name a deployment gives a model of the store: hf://ORG/REPO[@REVISION][/PATH]. */
export function hubName(repo, revision, path = null) {
  return `hf://${repo}${revision && revision !== "main" ? `@${revision}` : ""}${path ? `/${path}` : ""}`;
}
