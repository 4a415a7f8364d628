"""`msgbus destination schema put|list|show`: a destination's payload schema versions, through
the admin API (admin URL and token as for `msgbus replay`; docs/schemas.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import orjson

from msgbus_cli.admin_client import AdminClient, admin_options

JSON_OUT = click.option("--json", "as_json", is_flag=True, help="Same as --output json.")
MODES = ("none", "backward", "forward", "full")


@click.group()
def schema() -> None:
    """Register and read the versions of a destination's payload schema."""


def _path(code: str) -> str:
    return f"/v1/destinations/{code}/schemas"


def _echo_json(value: Any) -> None:
    click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode())


@schema.command("put")
@admin_options
@click.argument("code")
@click.argument("schema_file", type=click.Path(exists=True, dir_okay=False, path_type=Path,
                                               allow_dash=True))
@click.option("--compatibility", type=click.Choice(MODES),
              help="Checked now and for later versions (default: the destination's current "
                   "mode; backward for the first version).")
@JSON_OUT
def schema_put(client: AdminClient, code: str, schema_file: Path, compatibility: str | None,
               as_json: bool) -> None:
    """Register SCHEMA_FILE (JSON Schema draft 2020-12; '-' for stdin) as the next version.
    An incompatible one is refused with each change that breaks the mode."""
    as_json = as_json or client.json
    with click.open_file(str(schema_file)) as file:
        raw = file.read()
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise click.ClickException(f"{schema_file} is not JSON: {exc}") from exc
    body: dict[str, Any] = {"schema": document}
    if compatibility is not None:
        body["compatibility"] = compatibility
    answer = client.call("PUT", _path(code), json=body)
    if as_json:
        _echo_json(answer)
    else:
        click.echo(f"{code}: version {answer['version']} registered "
                   f"({answer['compatibility']}); receivers enforce it within seconds")


@schema.command("list")
@admin_options
@click.argument("code")
@JSON_OUT
def schema_list(client: AdminClient, code: str, as_json: bool) -> None:
    """The versions of the destination's schema, oldest first."""
    as_json = as_json or client.json
    versions = client.call("GET", _path(code))
    if as_json:
        _echo_json(versions)
        return
    if not versions:
        click.echo(f"{code} has no payload schema")
        return
    click.echo(f"{'VERSION':>7}  {'COMPATIBILITY':<13}  {'CREATED':<25}  BY")
    for v in versions:
        click.echo(f"{v['version']:>7}  {v['compatibility']:<13}  {v['created_at'][:25]:<25}  "
                   f"{v['created_by']}")


@schema.command("show")
@admin_options
@click.argument("code")
@click.argument("version", type=click.IntRange(min=1), required=False)
@JSON_OUT
def schema_show(client: AdminClient, code: str, version: int | None, as_json: bool) -> None:
    """One version of the schema (default: the latest): the schema itself, or with --json
    the whole record."""
    as_json = as_json or client.json
    if version is None:
        versions = client.call("GET", _path(code))
        if not versions:
            raise click.ClickException(f"{code} has no payload schema")
        found = versions[-1]
    else:
        found = client.call("GET", f"{_path(code)}/{version}")
    _echo_json(found if as_json else found["schema"])
