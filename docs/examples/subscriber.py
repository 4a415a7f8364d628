"""A msgbus subscriber outside the bus's code: the standard library checks each push's
signature (Standard Webhooks scheme), the CloudEvents SDK (`cloudevents` 2.x) reads its
attributes.

The signature is checked here by hand, in a few lines, because the `standardwebhooks` package
decodes the body as UTF-8 text first, and parses it as JSON by default: it cannot verify a push
whose body is bytes of another kind (an image, a protobuf). For JSON bodies it works as well.

    pip install cloudevents
    MSGBUS_SIGNING_SECRET=whsec_... python subscriber.py 8000

Each message is printed as one JSON line (a batch push, `application/cloudevents-batch+json`,
one line per message); a push that does not verify is answered 401.
"""

import base64
import hashlib
import hmac
import json
import os
import sys
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cloudevents.core.bindings.http import HTTPMessage, from_binary_event
from cloudevents.core.formats.json import JSONFormat

BATCH = "application/cloudevents-batch+json"  # a batch subscription's pushes
TOLERANCE_S = 300  # refuse pushes signed longer ago than this (or as far in the future): replays
PRINTING = threading.Lock()  # pushes arrive in parallel: one whole line at a time


def verify(secret: str, headers: Mapping[str, str], body: bytes) -> None:
    """Raise ValueError unless one of the push's signatures is `secret`'s over its raw body.
    During a secret rotation a push carries one signature per secret: either one passes."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    message_id, timestamp = headers["webhook-id"], headers["webhook-timestamp"]
    if abs(time.time() - int(timestamp)) > TOLERANCE_S:
        raise ValueError("timestamp too far from now")
    signed = f"{message_id}.{timestamp}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    for entry in headers["webhook-signature"].split():
        version, _, signature = entry.partition(",")
        if version == "v1" and hmac.compare_digest(signature, expected):
            return
    raise ValueError("no matching signature")


class PushHandler(BaseHTTPRequestHandler):
    secret = os.environ["MSGBUS_SIGNING_SECRET"]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        headers = {name.lower(): value for name, value in self.headers.items()}
        try:
            verify(self.secret, headers, body)  # before anything reads the body
        except (KeyError, ValueError) as exc:
            self._answer(401, {"verified": False, "error": repr(exc)})
            return
        if headers.get("content-type", "").startswith(BATCH):
            # a JSON array of structured events, signed once; the SDK reads one event at a time
            events = [JSONFormat().read(None, json.dumps(e)) for e in json.loads(body)]
            for event in events:
                self._print(self._record(event, headers["webhook-id"], None))
            self._answer(204)  # every message of the batch is delivered
            return
        event = from_binary_event(HTTPMessage(headers=headers, body=body))
        self._print(self._record(event, None, len(body)))
        self._answer(204)

    @staticmethod
    def _record(event: Any, batch: str | None, size: int | None) -> dict[str, object]:
        """`size`: the body's bytes (a single push), else those of the event's data."""
        attributes = event.get_attributes()
        data = event.get_data()
        if size is None:
            size = len(data) if isinstance(data, bytes) else len(json.dumps(data))
        return {
            "verified": True,
            "id": event.get_id(),  # de-duplicate on it: delivery is at least once
            "type": event.get_type(),  # the destination
            "source": event.get_source(),
            "bizid": attributes.get("bizid"),  # percent-decoded by the SDK (single pushes)
            "traceparent": attributes.get("traceparent"),
            "attempt": attributes.get("attempt"),
            "datacontenttype": attributes.get("datacontenttype"),
            "size": size,
            "batch": batch,
        }

    def _print(self, record: dict[str, object]) -> None:
        with PRINTING:
            print(json.dumps(record, ensure_ascii=False), flush=True)

    def _answer(self, status: int, record: dict[str, object] | None = None) -> None:
        if record is not None:
            self._print(record)
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass  # stdout carries one JSON line per push


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    print(json.dumps({"listening": port}), flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), PushHandler).serve_forever()
