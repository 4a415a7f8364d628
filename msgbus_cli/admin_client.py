"""What every `msgbus` command over the admin API shares: where the API is, the token, the
HTTP client, and printing its answers as JSON or a table.

The admin URL and token come from, first to last:

1. the flags `--admin-url` (or `--admin`) and `--token`;
2. the environment, `MSGBUS_ADMIN_URL` and `MSGBUS_ADMIN_TOKEN`;
3. the config file, `admin_url` and `token` in `$MSGBUS_CLI_CONFIG`, else
   `$XDG_CONFIG_HOME/msgbus/cli.toml` (default `~/.config/msgbus/cli.toml`);
4. the files `admin-url` and `admin-token` that `msgbus up` writes in its state directory.

Each value is looked up on its own: a URL from the environment may go with a token from the
config file. A 4xx or 5xx of the API prints its message (and field) and exits 1.
"""

from __future__ import annotations

import functools
import os
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import click
import httpx
import orjson

from msgbus_cli.stack import ADMIN_TOKEN_FILE, ADMIN_URL_FILE

F = TypeVar("F", bound=Callable[..., Any])
Output = Literal["json", "table"]
# a table cell longer than this is cut (the JSON output has it whole)
MAX_CELL_CHARS = 60


class AdminClient:
    """The admin API over httpx, and how the command's answer is to be printed."""

    def __init__(self, url: str, token: str, output: Output = "table") -> None:
        self.url = url
        self.output: Output = output
        self._http = httpx.Client(base_url=url, timeout=30,
                                  headers={"authorization": f"Bearer {token}"})

    @property
    def json(self) -> bool:
        return self.output == "json"

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The API's JSON answer (None for a 204); a ClickException with its message for a
        4xx/5xx or when the API cannot be reached."""
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise click.ClickException(f"admin API at {self.url} unreachable: {exc}") from exc
        if response.status_code >= 400:
            raise click.ClickException(f"{response.status_code}: {_error_detail(response)}")
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def call_confirmed(self, yes: bool, question: str, method: str, path: str,
                       **kwargs: Any) -> Any:
        """`call`, once the user confirmed `question` (at once with --yes)."""
        if not yes:
            click.confirm(question, abort=True)
        return self.call(method, path, **kwargs)

    def show(self, answer: Any, text: Callable[[Any], str] | str | None = None) -> None:
        """Print `answer` as JSON, or as `text` (a string, or made from the answer)."""
        if self.json:
            print_json(answer)
        elif callable(text):
            click.echo(text(answer))
        elif text is not None:
            click.echo(text)

    def show_rows(self, answer: Any, rows: Sequence[dict[str, Any]], columns: Sequence[str],
                  empty: str = "none") -> None:
        """Print the whole `answer` as JSON, or `rows` of it as a table."""
        if self.json:
            print_json(answer)
        else:
            self.show_table(rows, columns, empty)

    def show_table(self, rows: Sequence[dict[str, Any]], columns: Sequence[str],
                   empty: str = "none") -> None:
        """Print `rows` as JSON, or as a table of `columns` (dotted names reach into
        nested objects)."""
        if self.json:
            print_json(list(rows))
        elif not rows:
            click.echo(empty, err=True)
        else:
            click.echo(render_table(rows, columns))


def _error_detail(response: httpx.Response) -> str:
    try:
        body = response.json()
        detail = str(body.get("message") or body.get("detail") or response.text)
        if body.get("field"):
            detail += f" (field: {body['field']})"
        for change in body.get("incompatibilities") or []:
            detail += (f"\n  {change['path']}: {change['message']} (breaks "
                       f"{' and '.join(change['breaks'])})")
    except (ValueError, AttributeError, KeyError, TypeError):
        detail = response.text or response.reason_phrase
    return detail


def print_json(value: Any) -> None:
    click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())


def _cell(row: dict[str, Any], column: str) -> str:
    value: Any = row
    for part in column.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | dict):
        value = orjson.dumps(value).decode() if isinstance(value, dict) else ",".join(
            str(v) for v in value)
    text = str(value).replace("\n", " ")
    return text if len(text) <= MAX_CELL_CHARS else text[:MAX_CELL_CHARS - 1] + "…"


def render_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Plain columns under upper-case headers, each as wide as its widest cell."""
    cells = [[_cell(row, c) for c in columns] for row in rows]
    headers = [c.rsplit(".", 1)[-1].upper() for c in columns]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
              for r in cells]
    return "\n".join(lines)


def config_path() -> Path:
    explicit = os.environ.get("MSGBUS_CLI_CONFIG")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "msgbus" / "cli.toml"


def _config_file() -> dict[str, Any]:
    path = config_path()
    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise click.UsageError(f"{path}: {exc}") from exc


def resolve(flag: str | None, env: str, key: str, state_file: Path, option: str) -> str:
    """The first of: the flag, the environment variable, the config file's key, the state
    directory's file."""
    if flag:
        return flag
    if os.environ.get(env):
        return os.environ[env]
    configured = _config_file().get(key)
    if configured:
        return str(configured)
    if state_file.exists():
        return state_file.read_text().strip()
    raise click.UsageError(
        f"no {key}: pass {option}, set {env}, put {key} in {config_path()}, or run "
        f"`msgbus up` (which writes {state_file})")


OUTPUT_OPTION = click.option("--output", "-o", type=click.Choice(["table", "json"]),
                             default="table", show_default=True,
                             help="table: for people; json: the API's JSON answer.")


def admin_options(command: F) -> F:
    """--admin-url, --token, --state-dir and --output; the command gets a ready `client`."""

    @click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
                  default=lambda: os.environ.get("MSGBUS_STATE_DIR", ".msgbus"),
                  show_default=".msgbus", help="Where `msgbus up` keeps the admin URL/token.")
    @click.option("--admin-url", "--admin", "admin_url",
                  help="Admin API URL [default: $MSGBUS_ADMIN_URL, the config file's "
                       "admin_url, or the one `msgbus up` wrote].")
    @click.option("--token", help="Admin bootstrap token or a user's API token [default: "
                                  "$MSGBUS_ADMIN_TOKEN, the config file's token, or the one "
                                  "`msgbus up` wrote].")
    @OUTPUT_OPTION
    @functools.wraps(command)
    def wrapper(state_dir: Path, admin_url: str | None, token: str | None, output: Output,
                **kwargs: Any) -> Any:
        url = resolve(admin_url, "MSGBUS_ADMIN_URL", "admin_url", state_dir / ADMIN_URL_FILE,
                      "--admin-url")
        secret = resolve(token, "MSGBUS_ADMIN_TOKEN", "token", state_dir / ADMIN_TOKEN_FILE,
                         "--token")
        return command(client=AdminClient(url, secret, output), **kwargs)

    return wrapper  # type: ignore[return-value]


BY_OPTION = click.option("--by", "requested_by", default=lambda: os.environ.get("USER", "admin"),
                         help="Who asks, for the audit record (default: $USER).")
YES_OPTION = click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
