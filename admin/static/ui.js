// The UI's only script: buttons and forms that call the JSON API with the session's CSRF token
// (from <meta name="csrf-token">). Errors (the API's message and field) show in #notice.

function csrf() {
  return document.querySelector('meta[name="csrf-token"]').content;
}

// {ok, answer}: the answer's JSON either way (a successful one may itself have a "failed" field,
// e.g. a replay's count)
async function call(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: {"content-type": "application/json", "x-csrf-token": csrf()},
    body: JSON.stringify(body || {}),
  });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) {
    const where = answer.field ? ` (${answer.field})` : "";
    document.getElementById("notice").textContent =
      `${response.status}: ${answer.message || response.statusText}${where}`;
    return {ok: false, answer};
  }
  document.getElementById("notice").textContent = "";
  return {ok: true, answer};
}

// The input a field path of an error names: "retry_policy.delays_s.2" is the input named
// "retry_policy.delays_s" (a list typed in one input), "filters.0.values" the row's input.
function inputFor(form, path) {
  const parts = (path || "").split(".");
  while (parts.length) {
    const input = form.querySelector(`[name="${CSS.escape(parts.join("."))}"]`);
    if (input) return input;
    parts.pop();
  }
  return null;
}

// Each field's validation message next to it (aria-describedby), cleared on the next submit.
function showFieldErrors(form, answer) {
  form.querySelectorAll(".field-error").forEach((element) => element.remove());
  form.querySelectorAll("[aria-invalid]").forEach((element) => element.removeAttribute("aria-invalid"));
  for (const error of answer.errors || [{field: answer.field, message: answer.message}]) {
    const input = inputFor(form, error.field);
    if (!input) continue;
    const note = document.createElement("span");
    note.className = "field-error";
    note.id = `error-${input.name.replaceAll(".", "-")}`;
    note.textContent = error.message;
    input.setAttribute("aria-invalid", "true");
    input.setAttribute("aria-describedby", note.id);
    input.insertAdjacentElement("afterend", note);
  }
}

// body["a.b.0.c"] = value, building objects and lists on the way (numeric parts are indexes).
function setPath(body, path, value) {
  const parts = path.split(".");
  let node = body;
  parts.slice(0, -1).forEach((part, index) => {
    const listNext = /^\d+$/.test(parts[index + 1]);
    if (node[part] === undefined) node[part] = listNext ? [] : {};
    node = node[part];
  });
  node[parts[parts.length - 1]] = value;
}

// Lists built from numbered fields lose the holes of rows left empty.
function compact(value) {
  if (Array.isArray(value)) return value.filter((item) => item !== undefined).map(compact);
  if (value && typeof value === "object") {
    for (const key of Object.keys(value)) value[key] = compact(value[key]);
  }
  return value;
}

// <button data-post="<API path>" [data-method="DELETE"] [data-body='{...}'] [data-confirm="..."]
//  [data-then="<url>"] [data-show="#element"]>: POST (or data-method), then show the answer in
//  data-show, go to data-then, or reload.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("[data-post]");
  if (!button) return;
  event.preventDefault();
  if (button.dataset.confirm && !window.confirm(button.dataset.confirm)) return;
  const method = button.dataset.method || "POST";
  const {ok, answer} = await call(method, button.dataset.post,
                                 JSON.parse(button.dataset.body || "{}"));
  if (!ok) return;
  if (button.dataset.show) {
    document.querySelector(button.dataset.show).textContent = JSON.stringify(answer, null, 2);
  } else if (button.dataset.then) {
    window.location = button.dataset.then;
  } else {
    window.location.reload();
  }
});

// <form data-api="<API path, {field} filled from the form>" [data-method="PUT"]
//  [data-then="<url, {field} filled>"]>: sent as JSON (a field that fills the API path is not
// also in the body; one that fills only data-then is). Empty fields are left out, checkboxes are
// booleans, number inputs numbers, data-json fields parsed, data-list fields split on commas
// (data-list="number": into numbers), datetime-local read as UTC; a dotted name ("circuit.
// cooldowns_s", "filters.0.field") sets a nested field, and a fieldset[data-row] whose fields
// are all empty is left out. A fieldset[data-entry="auth.headers"] sets one entry of that object:
// its [data-key] field's value is the key, its [data-value] field's the value (left out when
// both are empty; neither has a name, so a key with a dot stays whole). A submit button with
// value "dry_run" asks for a count only and shows it in #dry-run. [data-confirm="..."] asks
// first. Validation errors show by their fields.
function fieldValue(field) {
  const value = field.value;
  if (field.type === "checkbox") return field.checked;
  if (value.trim() === "") return undefined;
  if (field.type === "number") return Number(value);
  if (field.type === "datetime-local") return value + "Z";
  if ("json" in field.dataset) return JSON.parse(value);
  if ("list" in field.dataset) {
    const items = value.split(",").map((item) => item.trim()).filter((item) => item !== "");
    return field.dataset.list === "number" ? items.map(Number) : items;
  }
  return value;
}

function emptyRow(field) {
  const row = field.closest("fieldset[data-row]");
  return row && [...row.elements].every((f) => f.type === "checkbox" || f.value.trim() === "");
}

document.addEventListener("submit", async (event) => {
  const form = event.target.closest("form[data-api]");
  if (!form) return;
  event.preventDefault();
  if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) return;
  const body = {};
  let path = form.dataset.api;
  let then = form.dataset.then || "";
  for (const field of form.elements) {
    if (!field.name || field.type === "submit" || emptyRow(field)) continue;
    let value;
    try { value = fieldValue(field); } catch (error) {
      showFieldErrors(form, {errors: [{field: field.name, message: "not valid JSON"}]});
      return;
    }
    if (value === undefined) continue;
    then = then.replace(`{${field.name}}`, encodeURIComponent(value));
    if (path.includes(`{${field.name}}`)) {
      path = path.replace(`{${field.name}}`, encodeURIComponent(value));
      continue;
    }
    setPath(body, field.name, value);
  }
  for (const row of form.querySelectorAll("fieldset[data-entry]")) {
    const key = row.querySelector("[data-key]").value.trim();
    const value = row.querySelector("[data-value]").value.trim();
    if (key === "" && value === "") continue;
    const entries = row.dataset.entry.split(".").reduce((node, part) => (node[part] ??= {}), body);
    entries[key] = value;
  }
  const dryRun = event.submitter && event.submitter.value === "dry_run";
  if (dryRun) body.dry_run = true;
  const {ok, answer} = await call(form.dataset.method || "POST", path, compact(body));
  if (!ok) {
    showFieldErrors(form, answer);
    return;
  }
  showFieldErrors(form, {errors: []});
  if (dryRun) {
    document.getElementById("dry-run").textContent =
      `${answer.planned} pushes to ${answer.subscriptions.join(", ")}`;
  } else if (then) {
    window.location = then;
  } else {
    window.location.reload();
  }
});

// <button data-add-row="#template-id" data-to="#container">: a copy of the template's row,
// its names' "__" replaced with the next index.
document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-add-row]");
  if (!button) return;
  event.preventDefault();
  const container = document.querySelector(button.dataset.to);
  const index = container.querySelectorAll("fieldset[data-row]").length;
  const html = document.querySelector(button.dataset.addRow).innerHTML.replaceAll("__", index);
  container.insertAdjacentHTML("beforeend", html);
});
