// The configuration error of the declared deployments' files (GET api/host's `config.error`, and
// `event: config` as it comes and goes): a banner over every view with the file, line, table,
// field and message, shown until the files are valid again. Nothing of a refused change was
// applied, which the banner says, with what makes dgxmm read the files again.

const $ = (id) => document.getElementById(id);

/** Show `config` (GET api/host's `config`, or null: logged out, or no declared files). */
export function showConfig(config) {
  const error = config && config.error;
  $("config-error").hidden = !error;
  if (!error) return;
  $("config-error-text").textContent = error.message;
  $("config-error-file").textContent = error.file;
  row("line", error.line);
  row("table", error.table == null ? null : `[[deployments]] #${error.table}${error.name ? ` (${error.name})` : ""}`);
  row("field", error.field);
  $("config-error-then").textContent = error.recheck
    ? "Nothing of this change is applied; the deployments run as they were. dgxmm looks again every "
      + `${config.poll_s} s and applies it as soon as this is right, without an edit of the file.`
    : "Nothing of this change is applied; the deployments run as they were. Fix the file: dgxmm reads it again "
      + "once it is saved (dgxmm check-config says the same before you save).";
}

function row(name, value) {
  $(`config-error-${name}-row`).hidden = value == null;
  $(`config-error-${name}`).textContent = value == null ? "" : String(value);
}
