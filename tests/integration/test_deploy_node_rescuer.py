"""The node rescuer (`msgbus node-rescuer`, the Kubernetes DaemonSet) on real queues:
on one node root, a receiver buffer and a client spool whose processes were killed (-9) are
rescued into the real bus (Kafka, MongoDB records, pushed to a subscriber) and deleted, while a
receiver buffer and a client spool that live processes hold are left exactly as they are; queues
written more recently than --min-idle are left too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import httpx
import pytest
from msgbus_client.spooltools import inspect_spool
from msgbus_devtools import servers as services
from msgbus_devtools.testkit.bus import RunningBus, sample_value
from msgbus_devtools.testkit.children import SPOOLING_PRODUCER, ScriptChild, ScriptChildren
from msgbus_devtools.testkit.env import service_env
from msgbus_devtools.testkit.waiting import eventually

from receiver import bufferslots

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

# A receiver pod: claims a buffer slot on the node root and buffers COUNT messages (as its
# intake does on a 202), then waits to be killed before anything flushed them.
RECEIVER = textwrap.dedent(
    """
    import asyncio, sys, time, uuid
    from pathlib import Path
    from receiver.bufferslots import claim_slot
    from msgbus.models import Envelope
    from msgbus.settings import ReceiverSettings
    from receiver.flushing import open_buffer
    from receiver.intake import Intake
    root, destination, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    slot = claim_slot(root)
    buffer = open_buffer(ReceiverSettings(), slot.path)
    envelopes = [Envelope(message_id=str(uuid.uuid4()), destination=destination,
                          body=b'{"n": %d}' % n, source_app="tests") for n in range(count)]
    asyncio.run(Intake(buffer).accept(envelopes))
    for envelope in envelopes:
        print(envelope.message_id, flush=True)
    print(slot.path, flush=True)
    print("ready", flush=True)
    time.sleep(120)  # a pod that stays up until the test kills it
    """
)


def start_pod(children: ScriptChildren, script: str, *args: str) -> ScriptChild:
    """A process of ours standing for a pod; its `lines` are what it queued (message ids; a
    receiver pod's last line is its buffer slot)."""
    pod = children.start(script, *args)
    assert pod.lines, "the pod process did not queue its messages"
    return pod


def node_rescuer(bus: RunningBus, root: Path, state: Path, keys: Path, *args: str,
                 ) -> subprocess.CompletedProcess[str]:
    env = service_env()
    env.update({
        "MSGBUS_STATE_DIR": str(state),
        "MSGBUS_MONGO_URI": bus.connections.mongo_uri,
        "MSGBUS_MONGO_DB": bus.connections.mongo_db,
        "MSGBUS_KAFKA_BOOTSTRAP": bus.connections.kafka_bootstrap,
        "MSGBUS_RABBITMQ_URL": bus.connections.rabbitmq_url,
        "MSGBUS_INTERNAL_TOKEN": bus.connections.internal_token.get_secret_value(),
        "MSGBUS_RECEIVER_DISPATCHER_URL": bus.dispatcher_url,
        "MSGBUS_NODE_RESCUER_RECEIVER_URL": bus.receiver_url,
        "MSGBUS_NODE_RESCUER_API_KEY": "not-a-key",  # the app's own key must be used
        "MSGBUS_NODE_RESCUER_API_KEYS_DIR": str(keys),
    })
    return subprocess.run([sys.executable, "-m", "msgbus_cli", "node-rescuer", "--root",
                           str(root), *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=120)


def recorded(bus: RunningBus, destination: str) -> set[str]:
    docs = bus.query(bus.store.traces.find_messages(destination=destination, limit=1000))
    return {str(d["_id"]) for d in docs}


def test_node_rescuer_rescues_orphans_into_the_bus_and_never_touches_held_queues(
        bus: RunningBus, api_key: str, tmp_path: Path, children: ScriptChildren) -> None:
    destination = f"node-{uuid.uuid4().hex[:8]}"
    bus.create_destination(destination, "kafka")
    subscriber = bus.subscribe_recorder(destination, "sink")
    root, keys = tmp_path / "node", tmp_path / "keys"
    keys.mkdir()
    (keys / "shop").write_text(api_key + "\n")
    dead_url = f"http://127.0.0.1:{services.free_port()}"
    buffers = root / "receiver-buffer"

    gone_receiver = start_pod(children, RECEIVER, str(buffers), destination, "25")
    live_receiver = start_pod(children, RECEIVER, str(buffers), destination, "5")
    gone_producer = start_pod(children, SPOOLING_PRODUCER, dead_url, api_key,
                              str(root / "spool/shop/pod-1"), destination, "20")
    live_producer = start_pod(children, SPOOLING_PRODUCER, dead_url, api_key,
                              str(root / "spool/shop/pod-2"), destination, "7")
    gone_slot, live_slot = Path(gone_receiver.lines[-1]), Path(live_receiver.lines[-1])
    gone_receiver.kill()
    gone_producer.kill()

    # written just now: a pod restarting on its node would take them back, so they wait
    done = node_rescuer(bus, root, tmp_path / "state", keys, "--once", "--min-idle", "3600")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "receiver_buffer: 1 held, 1 idle, 0 orphaned; 0 rescued" in done.stdout
    assert "client_spool: 1 held, 1 idle, 0 orphaned; 0 rescued" in done.stdout
    assert not recorded(bus, destination)

    done = node_rescuer(bus, root, tmp_path / "state", keys, "--once", "--min-idle", "0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "receiver_buffer: 1 held, 0 idle, 1 orphaned; 1 rescued and removed" in done.stdout
    assert "client_spool: 1 held, 0 idle, 1 orphaned; 1 rescued and removed" in done.stdout

    expected = set(gone_receiver.lines[:-1]) | set(gone_producer.lines)
    live = set(live_receiver.lines[:-1]) | set(live_producer.lines)
    eventually(lambda: expected <= recorded(bus, destination), 30,
               "the orphans' messages recorded in MongoDB")
    eventually(lambda: expected <= subscriber.message_ids(), 60,
               "the orphans' messages pushed to the subscriber through Kafka")
    assert not (recorded(bus, destination) | subscriber.message_ids()) & live
    assert not gone_slot.exists() and not (root / "spool/shop/pod-1").exists()
    # the live ones: still held by their process, with everything still in them
    assert bufferslots.holder_of(live_slot) == f"pid={live_receiver.proc.pid} host={os.uname()[1]}"
    assert (live_slot / bufferslots.LMDB_DATA_FILE).is_file()
    live_spool = inspect_spool(root / "spool/shop/pod-2")
    assert (live_spool.pending, live_spool.held_by is not None) == (7, True)


def test_node_rescuer_serves_health_and_node_metrics_and_stops_on_sigterm(
        bus: RunningBus, tmp_path: Path) -> None:
    root = tmp_path / "node"
    (root / "spool").mkdir(parents=True)
    port = services.free_port()
    env = service_env()
    env.update({"MSGBUS_STATE_DIR": str(tmp_path / "state"),
                "MSGBUS_MONGO_URI": bus.connections.mongo_uri,
                "MSGBUS_MONGO_DB": bus.connections.mongo_db,
                "MSGBUS_NODE_RESCUER_PORT": str(port),
                "MSGBUS_NODE_RESCUER_SCAN_INTERVAL_S": "0.2"})
    process = subprocess.Popen([sys.executable, "-m", "msgbus_cli", "node-rescuer", "--root",
                                str(root)], cwd=REPO, env=env, stderr=subprocess.PIPE,
                               text=True)
    try:
        def scanned() -> dict[str, object] | None:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()
            except httpx.HTTPError:
                return None
            last = health["last_scan"]
            return last if {"receiver_buffer", "client_spool"} <= set(last) else None

        last = eventually(scanned, 30, "the node rescuer's first scans")
        assert json.dumps(last)
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert sample_value(metrics, "msgbus_node_queues",
                            {"kind": "client_spool", "state": "orphaned"}) == 0
        for kind in ("receiver_buffer", "client_spool"):
            assert sample_value(metrics, "msgbus_node_rescuer_last_scan_timestamp_seconds",
                                {"kind": kind}) > 0
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
