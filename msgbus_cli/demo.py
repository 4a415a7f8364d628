"""`msgbus up --demo`: a `demo` destination with a built-in subscriber that prints what it gets."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import click

from msgbus.models import BrokerKind, Destination, Subscription
from msgbus.settings import ConnectionSettings
from msgbus.store import MongoStore
from msgbus_cli.asgi import read_request, respond

DEMO_DESTINATION = "demo"
DEMO_SUBSCRIPTION = "printer"


class PrintingSubscriber:
    """A raw ASGI app: prints each push (id, biz id, body) and answers 200."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if (request := await read_request(scope, receive, send)) is None:
            return
        headers, body = request
        biz = f" biz_id={unquote(headers['ce-bizid'])}" if "ce-bizid" in headers else ""
        click.echo(click.style("demo subscriber got ", fg="green")
                   + f"{headers.get('ce-id')}{biz}: {body.decode('utf-8', 'replace')}")
        await respond(send, 200)


def demo_broker(conn: ConnectionSettings) -> BrokerKind:
    if conn.kafka_bootstrap:
        return BrokerKind.KAFKA
    if conn.rabbitmq_url:
        return BrokerKind.RABBITMQ
    return BrokerKind.DIRECT


async def register_demo(store: MongoStore, conn: ConnectionSettings, subscriber_url: str) -> None:
    await store.config.save_destination(Destination(code=DEMO_DESTINATION, broker=demo_broker(conn),
                                                    description="msgbus up --demo"))
    try:
        existing = await store.config.get_subscription(f"{DEMO_DESTINATION}/{DEMO_SUBSCRIPTION}")
        subscription = existing.model_copy(update={"url": subscriber_url, "paused": False})
    except Exception:
        subscription = Subscription(destination=DEMO_DESTINATION, name=DEMO_SUBSCRIPTION,
                                    url=subscriber_url)  # type: ignore[arg-type]
    await store.config.save_subscription(subscription)
