"""The web UI's Jinja2 templates (admin/templates), shared by its pages (admin/ui.py) and the
outage page (admin/outage.py)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from fastapi.templating import Jinja2Templates

HERE = Path(__file__).parent

templates = Jinja2Templates(directory=HERE / "templates")


def hms(value: str | datetime | None) -> str:
    """"HH:MM:SS" of a time (a datetime or an ISO 8601 string from another service's /health),
    for a page that says "since 14:02:11 UTC"."""
    if value is None:
        return ""
    when = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return f"{when:%H:%M:%S}"


templates.env.filters["hms"] = hms
