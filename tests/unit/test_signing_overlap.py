"""After a rotation, pushes are signed with the previous secret too until the overlap ends."""

from __future__ import annotations

from datetime import UTC, datetime

from msgbus.models import Subscription, new_signing_secret


def _rotated(until: datetime | None) -> Subscription:
    return Subscription(destination="orders", name="billing", url="http://127.0.0.1/hook",
                        signing_secrets=[new_signing_secret(), new_signing_secret()],
                        previous_secret_until=until)


def test_the_previous_secret_signs_until_the_overlap_ends() -> None:
    sub = _rotated(datetime(2030, 1, 1, tzinfo=UTC))
    before, after = datetime(2029, 12, 31, 23, 59, tzinfo=UTC), datetime(2030, 1, 1, tzinfo=UTC)
    assert sub.secrets_signing_at(before.timestamp()) == sub.signing_secrets
    assert sub.secrets_signing_at(after.timestamp()) == sub.signing_secrets[:1]


def test_without_an_end_the_previous_secret_signs_until_dropped() -> None:
    sub = _rotated(None)
    assert sub.secrets_signing_at(datetime(2100, 1, 1, tzinfo=UTC).timestamp()) == \
        sub.signing_secrets
