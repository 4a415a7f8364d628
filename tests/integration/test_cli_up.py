"""`msgbus up --demo` on embedded defaults, and `msgbus send` from the command line: what a
newcomer runs first."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from msgbus_devtools import servers as services
from msgbus_devtools.testkit.waiting import wait_until

MSGBUS = [sys.executable, "-m", "msgbus.cli"]


def test_up_demo_then_send_arrives_at_the_demo_subscriber(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ports = {name: services.free_port() for name in
             ("RECEIVER", "DISPATCHER", "COMPENSATOR", "ADMIN", "DEMO")}
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MSGBUS_")} | {"PYTHONUNBUFFERED": "1"}
    env |= {f"MSGBUS_{name}_PORT": str(port) for name, port in ports.items() if name != "DEMO"}
    log = (tmp_path / "up.log").open("w+")
    up = subprocess.Popen([*MSGBUS, "up", "--demo", "--state-dir", str(state),
                           "--demo-port", str(ports["DEMO"])],
                          stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until(lambda: "msgbus is up" in Path(log.name).read_text(), 60, "msgbus up")
        banner = Path(log.name).read_text()
        assert f"http://127.0.0.1:{ports['RECEIVER']}" in banner
        # the first admin, shown once, logs in to the admin
        password = re.search(r"first admin user: admin / (\S+)", banner)
        assert password is not None, banner
        login = httpx.post(f"http://127.0.0.1:{ports['ADMIN']}/v1/session", timeout=10,
                           json={"username": "admin", "password": password.group(1)})
        assert login.status_code == 200 and login.json()["role"] == "admin"

        started = time.monotonic()
        sent = subprocess.run([*MSGBUS, "send", "demo", '{"hello": 1}', "--state-dir",
                               str(state)], capture_output=True, text=True, env=env, timeout=60)
        assert sent.returncode == 0, sent.stderr
        message_id = sent.stdout.strip()
        wait_until(lambda: f"demo subscriber got {message_id}" in Path(log.name).read_text(),
                   10, "the demo subscriber to print the message")
        print(f"send -> demo subscriber: {time.monotonic() - started:.2f}s (incl. CLI start)")
        assert '{"hello":1}' in Path(log.name).read_text()

        bad = subprocess.run([*MSGBUS, "send", "demo", "{nope", "--state-dir", str(state)],
                             capture_output=True, text=True, env=env, timeout=60)
        assert bad.returncode != 0 and "not valid JSON" in bad.stderr
    finally:
        up.send_signal(signal.SIGINT)
        code = up.wait(30)
        log.close()
    output = (tmp_path / "up.log").read_text()
    assert code == 0, output
    assert "stopping the embedded MongoDB-protocol server" in output
    assert "msgbus: stopped." in output
