"""`msgbus up --demo` on embedded defaults, and `msgbus send` from the command line: what a
newcomer runs first. The demo destination goes through the embedded Kafka-protocol broker, and
Ctrl-C leaves none of the servers `msgbus up` started running."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from confluent_kafka import Consumer, TopicPartition
from msgbus_devtools import servers as services
from msgbus_devtools.testkit.waiting import eventually

from msgbus import codec
from msgbus.brokers.base import topic_name
from msgbus.processes import pid_alive

MSGBUS = [sys.executable, "-m", "msgbus_cli"]


def child_pids(pid: int) -> dict[int, str]:
    """The children of `pid` (every thread's) and their command lines."""
    children: dict[int, str] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
            children[int(child)] = cmdline.decode(errors="replace")
    return children


def message_ids_in_topic(bootstrap: str, topic: str) -> set[str]:
    """The ids of every record in `topic`, read from the start of each partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "test-cli-up-reader",
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        ids: set[str] = set()
        while (record := consumer.poll(2.0)) is not None:
            if record.error() is None:
                ids.add(codec.decode(record.value()).message_id)
        return ids
    finally:
        consumer.close()


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
    children: dict[int, str] = {}
    try:
        eventually(lambda: "msgbus is up" in Path(log.name).read_text(), 60, "msgbus up")
        banner = Path(log.name).read_text()
        assert f"http://127.0.0.1:{ports['RECEIVER']}" in banner
        # the demo destination is on the embedded Kafka-protocol broker, as the banner says
        kafka = re.search(r"^  demo +kafka +cluster default, (127\.0\.0\.1:\d+)$", banner, re.M)
        assert kafka is not None, banner
        admin = f"http://127.0.0.1:{ports['ADMIN']}"
        token = (state / "admin-token").read_text().strip()
        listed = httpx.get(f"{admin}/v1/destinations", timeout=10,
                           headers={"Authorization": f"Bearer {token}"}).json()
        assert {d["code"]: d["broker"] for d in listed}["demo"] == "kafka"
        children = child_pids(up.pid)
        assert any("tansu" in c for c in children.values()), children
        assert any("secantusd" in c for c in children.values()), children
        # the first admin, shown once, logs in to the admin
        password = re.search(r"first admin user: admin / (\S+)", banner)
        assert password is not None, banner
        login = httpx.post(f"{admin}/v1/session", timeout=10,
                           json={"username": "admin", "password": password.group(1)})
        assert login.status_code == 200 and login.json()["role"] == "admin"

        started = time.monotonic()
        sent = subprocess.run([*MSGBUS, "send", "demo", '{"hello": 1}', "--state-dir",
                               str(state)], capture_output=True, text=True, env=env, timeout=60)
        assert sent.returncode == 0, sent.stderr
        message_id = sent.stdout.strip()
        eventually(lambda: f"demo subscriber got {message_id}" in Path(log.name).read_text(),
                   20, "the demo subscriber to print the message")
        print(f"send -> demo subscriber: {time.monotonic() - started:.2f}s (incl. CLI start)")
        assert '{"hello":1}' in Path(log.name).read_text()
        # it went through Kafka, not the direct path
        assert message_id in message_ids_in_topic(kafka.group(1), topic_name("demo"))

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
    assert "stopping the embedded Kafka-protocol broker" in output
    assert "msgbus: stopped." in output
    # every server it started is gone (children of `msgbus up`, started in sessions of their
    # own: a Ctrl-C in the terminal reaches only `msgbus up`)
    left = {pid: command for pid, command in children.items() if pid_alive(pid)}
    assert not left, left
