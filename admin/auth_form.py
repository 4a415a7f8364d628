"""What the subscription form (admin/templates/subscription.html) shows of a subscription's
`auth`: each field's value by its input's name ("auth.basic.username"), and the header rows.

Every secret shows as `MASK`, never its value: the form sends the mask back, and the admin API
keeps the stored value for it (PushAuth.keeping). The form is sent as JSON by admin/static/
ui.js, which leaves empty fields out, so sections left empty are not set, and a form with every
auth field empty sets no auth."""

from __future__ import annotations

from dataclasses import dataclass, field

from msgbus.push_credentials import PushAuth

MIN_HEADER_ROWS = 3  # the stored headers, then empty rows: at least one, at least this many


@dataclass(frozen=True)
class AuthFields:
    values: dict[str, str] = field(default_factory=dict)  # input name -> value shown
    headers: list[tuple[str, str]] = field(default_factory=list)  # (name, masked value)


def auth_fields(auth: PushAuth | None) -> AuthFields:
    """The form's auth fields for `auth` (None: not set), secrets masked."""
    if auth is None:
        return AuthFields(headers=[("", "")] * MIN_HEADER_ROWS)
    shown = auth.masked()
    values = {f"auth.{kind}.{name}": str(value)
              for kind, part in shown.model_dump(mode="json", exclude={"headers"}).items()
              if part is not None
              for name, value in part.items() if value is not None}
    headers = list(shown.headers.items())
    headers += [("", "")] * max(1, MIN_HEADER_ROWS - len(headers))
    return AuthFields(values, headers)
