"""RabbitMQ's management HTTP API: where it is for a cluster, and one GET of a JSON list.

Shared by the dispatcher's broker-health monitor and the admin's replication report. The URL is
`rabbitmq_management_urls[cluster]`, or is derived from the cluster's amqp:// nodes (same host
and credentials, port 15672).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import httpx

from msgbus.settings import ConnectionSettings

MANAGEMENT_PORT = 15672
Endpoint = tuple[str, tuple[str, str]]  # base URL, (user, password)


def management_url(amqp_url: str) -> Endpoint:
    """The management API base URL and (user, password) of an amqp:// node URL."""
    parts = urlsplit(amqp_url)
    host = parts.hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    scheme = "https" if parts.scheme == "amqps" else "http"
    auth = (unquote(parts.username or "guest"), unquote(parts.password or "guest"))
    return f"{scheme}://{host}:{MANAGEMENT_PORT}", auth


def management_endpoints(conn: ConnectionSettings, cluster: str,
                         nodes: list[str]) -> list[Endpoint]:
    """The endpoints to ask about `cluster`, in turn: any node answers for the cluster."""
    configured = conn.rabbitmq_management_urls.get(cluster)
    if configured:
        parts = urlsplit(configured)
        auth = (unquote(parts.username or "guest"), unquote(parts.password or "guest"))
        netloc = parts.hostname or ""
        if parts.port:
            netloc = f"{netloc}:{parts.port}"
        return [(f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}", auth)]
    return [management_url(node) for node in nodes]


async def get_json_list(http: httpx.AsyncClient, url: str,
                        auth: tuple[str, str]) -> list[dict[str, Any]]:
    """GET a JSON list; raises httpx.HTTPError or ValueError."""
    response = await http.get(url, auth=auth)
    response.raise_for_status()
    found = response.json()
    if not isinstance(found, list):
        raise ValueError(f"{url}: expected a JSON list")
    return found
