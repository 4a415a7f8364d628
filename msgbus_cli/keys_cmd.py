"""`msgbus secrets`: the keys that seal stored secrets (msgbus/sealing.py)."""

from __future__ import annotations

import click

from msgbus.sealing import KEY_ID, new_key
from msgbus_cli.admin_client import AdminClient, admin_options


@click.group("secrets")
def secrets_group() -> None:
    """The keys that seal the secrets stored in MongoDB (signing and notify secrets)."""


@secrets_group.command("new-key")
@click.option("--id", "key_id", default="k1", show_default=True,
              help="The key's id, kept with every value it seals.")
def new_key_command(key_id: str) -> None:
    """Print a new key as MSGBUS_SECRET_KEYS takes it (id:key). To rotate: put it first in
    MSGBUS_SECRET_KEYS on every service (the old one after it), restart them, run
    `msgbus secrets rotate-key`, then drop the old key."""
    if not KEY_ID.match(key_id):
        raise click.BadParameter("letters, digits, '_', '.' and '-', at most 32",
                                 param_hint="--id")
    click.echo(new_key(key_id))


@secrets_group.command("rotate-key")
@admin_options
def rotate_key(client: AdminClient) -> None:
    """Seal every stored secret again with the admin's newest key; the old key may go once
    nothing is left under it."""
    answer = client.call("POST", "/v1/secrets/reseal")
    client.show(answer, lambda a: (
        f"{a['resealed']} documents sealed again with key {a['key_id']}; "
        + ("nothing is left under another key: the old key may go" if a["left"] == 0 else
           f"{a['left']} values are still under another key or plain: run it again once "
           "every admin has the new key")))
