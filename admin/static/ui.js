// Buttons with data-post="<API path>" POST to the JSON API with the session's CSRF token
// (from <meta name="csrf-token">), an optional JSON body from data-body, then reload or follow
// data-then. Errors are shown in the page's #notice.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("[data-post]");
  if (!button) return;
  event.preventDefault();
  if (button.dataset.confirm && !window.confirm(button.dataset.confirm)) return;
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const response = await fetch(button.dataset.post, {
    method: "POST",
    headers: {"content-type": "application/json", "x-csrf-token": csrf},
    body: button.dataset.body || "{}",
  });
  const notice = document.getElementById("notice");
  if (!response.ok) {
    const body = await response.json().catch(() => ({message: response.statusText}));
    notice.textContent = `${response.status}: ${body.message}`;
    return;
  }
  const answer = await response.json().catch(() => ({}));
  if (button.dataset.then) {
    window.location = button.dataset.then.replace("{id}", answer.replay_id || "");
  } else {
    window.location.reload();
  }
});

// Forms with data-api="<API path>" are sent as JSON (empty fields left out, "subscriptions"
// split on commas, datetime-local read as UTC). The submit button's value "dry_run" asks for
// the count only and shows it in #dry-run; otherwise the page reloads.
document.addEventListener("submit", async (event) => {
  const form = event.target.closest("form[data-api]");
  if (!form) return;
  event.preventDefault();
  const body = {};
  for (const [key, value] of new FormData(form)) {
    if (value === "") continue;
    if (key === "subscriptions") body[key] = value.split(",").map((s) => s.trim());
    else if (key === "since" || key === "until") body[key] = value + "Z";
    else if (key === "rate_per_s") body[key] = Number(value);
    else body[key] = value;
  }
  const dryRun = event.submitter && event.submitter.value === "dry_run";
  if (dryRun) body.dry_run = true;
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const response = await fetch(form.dataset.api, {
    method: "POST",
    headers: {"content-type": "application/json", "x-csrf-token": csrf},
    body: JSON.stringify(body),
  });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) {
    document.getElementById("notice").textContent = `${response.status}: ${answer.message}`;
    return;
  }
  if (dryRun) {
    document.getElementById("dry-run").textContent =
      `${answer.planned} pushes to ${answer.subscriptions.join(", ")}`;
  } else {
    window.location.reload();
  }
});
