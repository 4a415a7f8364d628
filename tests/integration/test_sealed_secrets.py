"""Secrets are stored sealed (msgbus/sealing.py, issue 40 part 3): what the previous version
stored plain is sealed when the admin starts, the API shows the plain value only to who may see
it, pushes stay signed with the same secret, and a key rotation under load loses no push and
leaves nothing under the old key."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from msgbus_client.verify import verify_push
from msgbus_devtools.testkit.bus import RunningBus
from msgbus_devtools.testkit.deployment import Deployment, Phases, Servers
from msgbus_devtools.testkit.env import TEST_SECRET_KEYS
from msgbus_devtools.testkit.sending import post_batches
from msgbus_devtools.testkit.subscriber import RecordingSubscriber
from msgbus_devtools.testkit.waiting import eventually

from msgbus.ids import uuid7
from msgbus.models import BrokerKind, Subscription, new_signing_secret
from msgbus.sealing import SecretKeys, key_id_of, new_key
from msgbus.store.sealed_secrets import reseal_secrets
from msgbus_cli.main import main


def test_plain_secrets_of_the_previous_version_are_sealed_at_start_and_still_sign(
        bus: RunningBus, api_key: str) -> None:
    code, team = f"seal-{uuid.uuid4().hex[:6]}", f"team-{uuid.uuid4().hex[:6]}"
    bus.create_destination(code, "direct")
    subscriber = RecordingSubscriber()
    plain = new_signing_secret()
    # as 0.1 stored them: plain (the test kit's own store has no keys and writes as given)
    bus.query(bus.store.config.save_subscription(Subscription(
        destination=code, name="old", url=bus.serve_subscriber(subscriber),  # type: ignore[arg-type]
        signing_secrets=[plain])))
    bus.admin.put(f"/v1/teams/{team}", json={"notify_url": bus.serve_subscriber(
        RecordingSubscriber())}).raise_for_status()
    plain_notify = new_signing_secret()
    bus.query(bus.store.db["teams"].update_one({"_id": team},
                                             {"$set": {"notify_secret": plain_notify}}))
    assert bus.documents_holding({plain, plain_notify})

    bus.start_admin()  # an admin of this version starts: it seals what it finds plain
    assert not bus.documents_holding({plain, plain_notify})
    stored = bus.query(bus.store.db["subscriptions"].find_one({"_id": f"{code}/old"}))
    assert [key_id_of(s) for s in stored["signing_secrets"]] == ["test"]

    revealed = bus.admin.post(f"/v1/destinations/{code}/subscriptions/old/secrets/reveal")
    assert revealed.json()["signing_secrets"] == [plain]
    assert bus.admin.get(f"/v1/teams/{team}").json().get("notify_secret") is None
    bus.wait_for_workers([f"{code}/old"])
    post_batches(bus.receiver_url, api_key, [{"message_id": uuid7(), "destination": code,
                                              "body": {"n": n}} for n in range(5)])
    eventually(lambda: len(subscriber.pushes) >= 5, 30, "the five pushes")
    for push in subscriber.pushes:  # signed with the very secret the subscriber was given
        verify_push(plain, push.headers, push.body)

    made = bus.subscribe(code, "new", bus.serve_subscriber(RecordingSubscriber()), paused=True)
    [new_plain] = made["signing_secrets"]  # shown plain to whoever configures the subscriber
    assert new_plain.startswith("whsec_") and not bus.documents_holding({new_plain})
    cli = CliRunner()
    rotated = cli.invoke(main, ["secrets", "rotate-key", "--admin-url", bus.admin_url,
                                "--token", bus.admin_token, "-o", "json"])
    assert rotated.exit_code == 0, rotated.output
    assert orjson.loads(rotated.output) == {"resealed": 0, "left": 0, "key_id": "test"}
    printed = cli.invoke(main, ["secrets", "new-key", "--id", "k2"])
    assert SecretKeys.parse(printed.output).current == "k2"


@pytest.fixture
def deployment(private_servers: Servers, tmp_path: Path) -> Iterator[Deployment]:
    deployed = Deployment(private_servers, tmp_path,
                          {f"r-{uuid.uuid4().hex[:6]}": BrokerKind.RABBITMQ})
    yield deployed
    deployed.close()


@pytest.mark.serial
def test_a_key_rotation_under_load_loses_no_push_and_leaves_nothing_under_the_old_key(
        deployment: Deployment) -> None:
    """The runbook of docs/operations.md, under a steady load: the new key put first on every
    pushing service (restarted one by one), every value sealed again, the old key dropped (a
    second restart). Every push verifies with the subscriber's one secret throughout, and
    carries the subscription's API-key header (a push credential, sealed too) once the
    dispatchers have read it."""
    phases = Phases()
    new_text = new_key("k2")
    both, old = SecretKeys.parse(f"{new_text},{TEST_SECRET_KEYS}"), SecretKeys.parse(
        TEST_SECRET_KEYS)
    with deployment.logs_on_failure():
        deployment.start()
        plain = _stored_secrets(deployment)
        api_key = f"key-{uuid.uuid4().hex}"
        deployment.run(deployment.store.db["subscriptions"].update_many(
            {}, {"$set": {"auth": {"headers": {"X-Api-Key": old.seal(api_key)}}}}))
        deployment.run(reseal_secrets(deployment.store.db, old))  # as a running bus has them
        load = deployment.load(rate_per_s=100, duration_s=20).start()
        deployment.wait_warm(20)
        with phases.phase("the new key first on the dispatcher and the compensator"):
            _restart_with_keys(deployment, f"{new_text},{TEST_SECRET_KEYS}")
        with phases.phase("every stored secret sealed again with the new key"):
            done = deployment.run(reseal_secrets(deployment.store.db, both))
            assert done.left == 0 and done.resealed >= 1, done
        with phases.phase("the old key dropped"):
            _restart_with_keys(deployment, new_text)
        load.join()
        deployment.check_everything_delivered(load, phases)
        print(phases.report())

    assert {key_id_of(s) for values in _stored_secrets(deployment).values()
            for s in values} == {"k2"}
    for sub_id, subscriber in deployment.subscriber_of.items():
        [secret] = [both.open(s) for s in plain[sub_id]]
        assert subscriber.pushes, sub_id
        for push in subscriber.pushes:
            verify_push(secret, push.headers, push.body)
        assert {p.headers.get("x-api-key") for p in subscriber.pushes} <= {None, api_key}
        assert subscriber.pushes[-1].headers.get("x-api-key") == api_key, sub_id


def _stored_secrets(deployment: Deployment) -> dict[str, list[str]]:
    """Per subscription, every secret it stores: signing secrets and push credentials."""
    async def read() -> dict[str, list[str]]:
        return {doc["_id"]: doc["signing_secrets"]
                + list(((doc.get("auth") or {}).get("headers") or {}).values())
                async for doc in deployment.store.db["subscriptions"].find({})}
    return deployment.run(read())


def _restart_with_keys(deployment: Deployment, keys: str) -> None:
    for process in (deployment.dispatcher, deployment.compensator):
        assert process is not None
        process.env["MSGBUS_SECRET_KEYS"] = keys
        process.stop()
        process.start()
