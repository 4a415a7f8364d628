"""A producer process for durability tests: one `MsgbusClient` on a given spool dir sends N
messages from one thread and prints each message id whose send() returned on its own line,
flushed at once, so a test that kills this process knows exactly which sends returned.

    MSGBUS_API_KEY=... python -m msgbus_devtools.testkit.producer_proc \
        RECEIVER_URL SPOOL_DIR DESTINATION N

Prints "done <left>" after close() when it was not killed first.
"""

from __future__ import annotations

import os
import sys

from msgbus_client import MsgbusClient


def main(argv: list[str]) -> int:
    receiver_url, spool_dir, destination, count = argv[0], argv[1], argv[2], int(argv[3])
    client = MsgbusClient(receiver_url, os.environ["MSGBUS_API_KEY"], spool_dir=spool_dir)
    out = sys.stdout
    for i in range(count):
        message_id = client.send(destination, {"n": i}, biz_id=f"kill-{i % 20}")
        out.write(message_id + "\n")  # one write of < PIPE_BUF bytes: never torn
        out.flush()
    left = client.close(30)
    out.write(f"done {left}\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
