"""Sending messages to a receiver over HTTP in tests: the batch endpoint, every one accepted."""

from __future__ import annotations

from typing import Any

import httpx


def post_batches(url: str, api_key: str, messages: list[dict[str, Any]],
                 batch_size: int = 50) -> None:
    """POSTs `messages` (each with its destination) to the receiver at `url` in batches, in
    order; every one must be answered 202."""
    with httpx.Client(base_url=url, timeout=30,
                      headers={"authorization": f"Bearer {api_key}"}) as client:
        for start in range(0, len(messages), batch_size):
            response = client.post("/v1/messages",
                                   json={"messages": messages[start:start + batch_size]})
            response.raise_for_status()
            results = response.json()["results"]
            assert {r["status"] for r in results} == {202}, results[:3]
