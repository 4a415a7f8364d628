// The UI's only script: buttons and forms that call the JSON API with the session's CSRF token
// (from <meta name="csrf-token">). Errors (the API's message and field) show in #notice.

function csrf() {
  return document.querySelector('meta[name="csrf-token"]').content;
}

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
    return null;
  }
  document.getElementById("notice").textContent = "";
  return answer;
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
  const answer = await call(method, button.dataset.post, JSON.parse(button.dataset.body || "{}"));
  if (answer === null) return;
  if (button.dataset.show) {
    document.querySelector(button.dataset.show).textContent = JSON.stringify(answer, null, 2);
  } else if (button.dataset.then) {
    window.location = button.dataset.then;
  } else {
    window.location.reload();
  }
});

// <form data-api="<API path, {field} filled from the form>" [data-method="PUT"]
//  [data-then="<url, {field} filled>"]>: sent as JSON. Empty fields are left out, checkboxes are
// booleans, number inputs numbers, data-json fields parsed, data-list fields split on commas,
// datetime-local read as UTC. A submit button with value "dry_run" asks for a count only and
// shows it in #dry-run. [data-confirm="..."] asks first.
document.addEventListener("submit", async (event) => {
  const form = event.target.closest("form[data-api]");
  if (!form) return;
  event.preventDefault();
  if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) return;
  const body = {};
  let path = form.dataset.api;
  let then = form.dataset.then || "";
  for (const field of form.elements) {
    if (!field.name || field.type === "submit") continue;
    let value = field.value;
    if (field.type === "checkbox") value = field.checked;
    else if (value === "") continue;
    else if (field.type === "number") value = Number(value);
    else if (field.type === "datetime-local") value = value + "Z";
    else if ("json" in field.dataset) {
      try { value = JSON.parse(value); } catch (error) {
        document.getElementById("notice").textContent = `${field.name}: not valid JSON`;
        return;
      }
    } else if ("list" in field.dataset) value = value.split(",").map((s) => s.trim());
    if (path.includes(`{${field.name}}`) || then.includes(`{${field.name}}`)) {
      path = path.replace(`{${field.name}}`, encodeURIComponent(value));
      then = then.replace(`{${field.name}}`, encodeURIComponent(value));
      continue;
    }
    body[field.name] = value;
  }
  const dryRun = event.submitter && event.submitter.value === "dry_run";
  if (dryRun) body.dry_run = true;
  const answer = await call(form.dataset.method || "POST", path, body);
  if (answer === null) return;
  if (dryRun) {
    document.getElementById("dry-run").textContent =
      `${answer.planned} pushes to ${answer.subscriptions.join(", ")}`;
  } else if (then) {
    window.location = then;
  } else {
    window.location.reload();
  }
});
