"""Failed sign-ins are slowed, then locked out (msgbus/throttle.py), on the running bus: the
admin's counts are in MongoDB (shared by its replicas), the receiver's in its process. An
address is simulated with X-Forwarded-For, which uvicorn honours from 127.0.0.1 (a proxy
named in FORWARDED_ALLOW_IPS, in production)."""

from __future__ import annotations

import time
import uuid

import httpx
from msgbus_devtools.testkit.bus import USER_PASSWORD, RunningBus
from msgbus_devtools.testkit.waiting import eventually

from msgbus.ids import uuid7

LOCK_S = 8.0  # this test's admins lock for 8 s (the default is 30 s), longer than its 24 tries


def _sign_in(url: str, name: str, password: str, address: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/session", json={"username": name, "password": password},
                      headers={"x-forwarded-for": address}, timeout=30)


def test_admin_signins_30_wrong_passwords_lock_out_that_address_not_the_user(
        bus: RunningBus) -> None:
    name = bus.add_user("viewer")
    admin_url = bus.start_admin(signin_lock_first_s=LOCK_S, signin_lock_max_s=LOCK_S)
    other_replica = bus.start_admin(signin_lock_first_s=LOCK_S, signin_lock_max_s=LOCK_S)
    attacker, owner = f"10.66.{uuid.uuid4().int % 250}.1", "10.77.0.1"
    began = time.monotonic()
    statuses = [_sign_in(admin_url, name, "wrong password", attacker).status_code
                for _ in range(30)]
    assert statuses[:6] == [401] * 6 and statuses[6:] == [429] * 24, statuses
    assert time.monotonic() - began > 1.5  # the 4th to 6th failures waited 0.25, 0.5 and 1 s

    locked = _sign_in(other_replica, name, USER_PASSWORD, attacker)  # the right one, too
    assert locked.status_code == 429 and int(locked.headers["retry-after"]) >= 1
    assert locked.json()["error"] == "too_many_attempts"
    shown = bus.admin.get("/v1/signins/locked").json()
    assert {"kind": "user-address", "key": f"{name}|{attacker}"} in [
        {"kind": s["kind"], "key": s["key"]} for s in shown]

    assert _sign_in(admin_url, name, USER_PASSWORD, owner).status_code == 200  # not the user
    eventually(lambda: _sign_in(admin_url, name, USER_PASSWORD, attacker).status_code == 200,
               30, "the lock to end by itself")


def test_admin_wrong_api_tokens_lock_out_their_address(bus: RunningBus) -> None:
    admin_url = bus.start_admin(signin_lock_first_s=LOCK_S, signin_lock_max_s=LOCK_S)
    address = f"10.88.{uuid.uuid4().int % 250}.1"
    headers = {"x-forwarded-for": address, "authorization": "Bearer mbt_guessed"}
    statuses = [httpx.get(f"{admin_url}/v1/destinations", headers=headers, timeout=30
                          ).status_code for _ in range(22)]
    assert statuses[:20] == [401] * 20 and statuses[20:] == [429] * 2, statuses
    assert httpx.get(f"{admin_url}/v1/destinations", timeout=30, headers={
        "x-forwarded-for": address, "authorization": f"Bearer {bus.admin_token}"}
    ).status_code == 200  # a right token is never held back


def test_receiver_wrong_api_keys_lock_out_their_address_and_known_keys_still_send(
        bus: RunningBus) -> None:
    code = f"throttle-{uuid.uuid4().hex[:6]}"
    bus.create_destination(code, "direct")
    key = bus.create_app(f"app-{uuid.uuid4().hex[:6]}")
    address = f"10.99.{uuid.uuid4().int % 250}.1"
    url = f"{bus.receiver_url}/v1/destinations/{code}/messages"
    body = {"message_id": uuid7(), "body": {"n": 1}}
    assert httpx.post(url, json=body, timeout=30, headers={
        "authorization": f"Bearer {key}", "x-forwarded-for": address}).status_code == 202
    wrong = {"authorization": "Bearer mbk_guessed", "x-forwarded-for": address}
    statuses = [httpx.post(url, json=body, headers=wrong, timeout=30).status_code
                for _ in range(32)]
    assert statuses[:30] == [401] * 30 and statuses[30:] == [429] * 2, statuses
    again = {"message_id": uuid7(), "body": {"n": 2}}
    assert httpx.post(url, json=again, timeout=30, headers={
        "authorization": f"Bearer {key}", "x-forwarded-for": address}).status_code == 202
