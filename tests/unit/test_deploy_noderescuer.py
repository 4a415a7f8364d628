"""The node rescuer's choices that need no running bus: which key sends a client spool,
and an orphan it cannot send (no receiver configured) counts as failed and stays on disk."""

from __future__ import annotations

import asyncio
from pathlib import Path

from msgbus_client import Spool, uuid7
from msgbus_client.message import Entry
from pydantic import SecretStr

from msgbus.settings import ConnectionSettings, NodeRescuerSettings, ReceiverSettings
from receiver.node_rescue import CLIENT_SPOOL, NodeRescuer
from receiver.rescue import BufferRescuer


def node_rescuer(root: Path, **settings: object) -> NodeRescuer:
    config = NodeRescuerSettings(root=root, min_idle_s=0, **settings)
    rescuer = BufferRescuer(ReceiverSettings(connections=ConnectionSettings()), 0)
    return NodeRescuer(config, rescuer)


def test_a_spool_is_sent_with_its_apps_key_else_the_default(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "shop").write_text("shop-key\n")
    node = node_rescuer(tmp_path / "node", api_key=SecretStr("default-key"), api_keys_dir=keys)
    assert node.api_key_for(tmp_path / "node/spool/shop/pod-1") == "shop-key"
    assert node.api_key_for(tmp_path / "node/spool/billing/pod-1") == "default-key"
    assert node_rescuer(tmp_path / "node").api_key_for(tmp_path / "node/spool/shop/x") == ""


def test_an_orphan_without_a_receiver_to_send_to_fails_and_stays(tmp_path: Path) -> None:
    spool_dir = tmp_path / "node/spool/shop/pod-1"
    spool = Spool(spool_dir)
    spool.put(Entry(message_id=str(uuid7()), destination="orders", payload=b'{"n": 1}'))
    spool.close()  # as if its pod died: nobody holds it now

    report = asyncio.run(node_rescuer(tmp_path / "node").scan_spools())
    assert (report.kind, report.orphaned, report.failed, report.ok) == (CLIENT_SPOOL, 1, 1, False)
    assert "RECEIVER_URL is not set" in report.errors[0]
    assert (spool_dir / "data.mdb").is_file()
