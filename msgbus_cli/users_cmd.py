"""`msgbus users ...`: create the first admin (and other users) straight in MongoDB, before any
admin API is reachable. Settings from MSGBUS_* variables (MSGBUS_MONGO_URI, MSGBUS_MONGO_DB)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import click

from msgbus.errors import Conflict
from msgbus.settings import ConnectionSettings
from msgbus.store import MongoStore
from msgbus.store.users import UserStore
from msgbus.users import MIN_PASSWORD_LENGTH, Principal, Role, hash_password, new_password

CLI_PRINCIPAL = Principal(name="msgbus-cli", role=Role.ADMIN, via="cli")


async def create_user(conn: ConnectionSettings, name: str, password: str, role: Role) -> None:
    store = MongoStore(conn.mongo_uri, conn.mongo_db)
    try:
        users = UserStore(store)
        await users.ensure_indexes()
        await users.create_user(name, hash_password(password), role)
        await users.audit(CLI_PRINCIPAL, "user.create", name, {"role": role.value})
    finally:
        await store.close()


async def ensure_first_admin(store: MongoStore, name: str = "admin") -> str | None:
    """If there are no users yet, create admin `name` with a random password and return it
    (to be shown once); None when users exist."""
    users = UserStore(store)
    if await users.count_users():
        return None
    password = new_password()
    await users.create_user(name, hash_password(password), Role.ADMIN)
    await users.audit(CLI_PRINCIPAL, "user.create", name, {"role": "admin", "first": True})
    return password


@click.group()
def users() -> None:
    """Admin users (the web UI and API log-ins)."""


@users.command("add")
@click.argument("name")
@click.option("--role", type=click.Choice([r.value for r in Role]), default="viewer",
              show_default=True)
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin.")
def add(name: str, role: str, password_stdin: bool, **_: Any) -> None:
    """Create user NAME (asks for the password)."""
    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = click.prompt("password", hide_input=True, confirmation_prompt=True)
    if len(password) < MIN_PASSWORD_LENGTH:
        raise click.BadParameter(f"at least {MIN_PASSWORD_LENGTH} characters",
                                 param_hint="password")
    try:
        asyncio.run(create_user(ConnectionSettings(), name, password, Role(role)))
    except Conflict as exc:
        raise click.ClickException(exc.message) from exc
    click.echo(f"user {name} ({role}) created")
