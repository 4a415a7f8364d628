"""Domain model: the message envelope, destinations, subscriptions and delivery state."""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    HttpUrl,
    Strict,
    StrictBool,
    StrictFloat,
    field_validator,
    model_validator,
)

from msgbus.push_credentials import PushAuth
from msgbus.teams import PLATFORM_TEAM, TeamName, team_of_label

CODE_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,99}$"
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
_CODE_RE = re.compile(CODE_PATTERN)
# what a producer app may send to: a destination code, or "*" for every one
APP_DESTINATION_PATTERN = r"^(\*|[a-z0-9][a-z0-9_.-]{0,99})$"
MAX_RETRY_DELAY_S = 30 * 24 * 3600.0
MAX_BATCH_MESSAGES = 1000
MAX_BATCH_BYTES = 16 * 1024 * 1024
# the longest a message may wait for its delivery (deliver_at, delay_s; a subscription's delay_s)
MAX_DELIVERY_DELAY_S = 30 * 24 * 3600.0
DEFAULT_DELIVERY_OBJECTIVE_S = 15 * 60.0
DEFAULT_DISPATCHERS = 2  # instances serving a subscription (msgbus/assignment.py)

JSON_CONTENT_TYPE = "application/json"
DEFAULT_CLUSTER = "default"  # the cluster MSGBUS_KAFKA_BOOTSTRAP / MSGBUS_RABBITMQ_URL define
# RocketMQ's schedule; the last delay repeats until success.
DEFAULT_RETRY_DELAYS_S: tuple[float, ...] = (
    10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)


def utcnow() -> datetime:
    return datetime.now(UTC)


def is_destination_code(value: str) -> bool:
    return _CODE_RE.match(value) is not None


class BrokerKind(StrEnum):
    KAFKA = "kafka"
    RABBITMQ = "rabbitmq"
    DIRECT = "direct"


class SchemaCompatibility(StrEnum):
    """Which new versions of a destination's payload schema are accepted (docs/schemas.md)."""

    NONE = "none"  # any
    BACKWARD = "backward"  # consumers on the new version read every body the old one took
    FORWARD = "forward"  # consumers on the old version read every body the new one takes
    FULL = "full"  # both


class DeliveryStatus(StrEnum):
    PENDING = "pending"  # accepted, no outcome yet
    DELIVERED = "delivered"  # the subscriber answered 2xx
    FAILED = "failed"  # last attempt failed; the compensator retries it
    PARKED = "parked"  # gave up by policy (dead letter); re-driven by hand
    # failed; the dispatcher retries it in place, because the subscription is ordered by biz_id
    # and the next message of the key waits for it
    RETRYING = "retrying"
    SKIPPED = "skipped"  # the subscription's filters did not match: not pushed, on purpose
    DISCARDED = "discarded"  # parked or scheduled, then dropped by an operator (with a reason)
    # not pushed before its due time (deliver_at, delay_s): the compensator pushes it when
    # `next_attempt_at` comes; an ordered subscription's dispatcher holds it in its key's lane
    # instead (`next_attempt_at` None); `scheduled_for` says when
    SCHEDULED = "scheduled"


# accepted and not done: the backlog (what the gauges count and the scaling follows)
UNDELIVERED_STATUSES = (DeliveryStatus.PENDING, DeliveryStatus.FAILED, DeliveryStatus.RETRYING)
# not final: the backlog and what waits for its time (not stuck, so not in the backlog)
OPEN_STATUSES = (*UNDELIVERED_STATUSES, DeliveryStatus.SCHEDULED)


@dataclass(slots=True)
class Envelope:
    """One message as the bus carries it. `body` is opaque bytes of `content_type`."""

    message_id: str
    destination: str
    body: bytes
    content_type: str = JSON_CONTENT_TYPE
    biz_id: str | None = None
    source_app: str | None = None
    created_at: datetime = field(default_factory=utcnow)
    received_at: datetime | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # the W3C trace context of the producer's span that sent it (msgbus/tracecontext.py)
    traceparent: str | None = None
    tracestate: str | None = None
    # A copy may have reached a dispatcher before: the broker hands it out again (RabbitMQ's
    # redelivered flag, a Kafka record older than its partition's assignment), or a receiver
    # re-publishes what a predecessor left in its buffer. The dispatcher looks these up in
    # MongoDB before pushing (dispatcher/redelivery.py); for the others it need not.
    redelivered: bool = False
    # the version of the destination's payload schema the body was validated against; None:
    # the destination had no schema when the receiver took it
    schema_version: int | None = None
    # pushed to no subscriber before this (the producer's deliver_at or delay_s); None: now
    deliver_at: datetime | None = None

    @property
    def accepted_at(self) -> datetime:
        """When the bus took the message: the receiver's time, or the client's for a message
        from before receivers stamped it."""
        return self.received_at or self.created_at


def _not_a_number(value: object) -> object:
    if isinstance(value, int | float) or (isinstance(value, str) and _NUMBER_RE.match(value)):
        raise ValueError("a date-time is RFC 3339 text (e.g. 2026-11-26T10:00:00Z), not a number")
    return value


_NUMBER_RE = re.compile(r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$")
# A date-time of an API: pydantic would also take a number (or numeric text) as a Unix time,
# which the OpenAPI document's `format: date-time` does not allow.
Timestamp = Annotated[datetime, BeforeValidator(_not_a_number)]


def _whole_float_as_int(value: object) -> object:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# An integer as JSON Schema has it: 114 or 114.0, never true or "114".
Integer = Annotated[int, BeforeValidator(_whole_float_as_int), Strict()]

# Integers with bounds that also show in the JSON Schema inside a union (`... | None`) or a
# list: there pydantic writes an `Integer`'s `Field(ge=...)` as unknown keys ("ge"), which
# clients and fuzzers ignore; bounds placed before the validator come out as minimum/maximum.
_WHOLE = (BeforeValidator(_whole_float_as_int), Strict())
AttemptCount = Annotated[int, Field(ge=1, le=1_000_000), *_WHOLE]
Count100k = Annotated[int, Field(ge=1, le=100_000), *_WHOLE]
HttpStatus = Annotated[int, Field(ge=100, le=599), *_WHOLE]
BatchSize = Annotated[int, Field(ge=1, le=MAX_BATCH_MESSAGES), *_WHOLE]


class ConfigModel(BaseModel):
    """Base of what operators configure. Numbers are finite: Python's JSON parser takes the
    literals NaN and Infinity, which would otherwise reach timers and rate limits. Booleans and
    numbers are strict (StrictBool, Integer, StrictFloat): pydantic would otherwise take 0 for
    false, true for 1 and "5" for 5, which the OpenAPI document does not allow."""

    model_config = ConfigDict(allow_inf_nan=False)


class RetryPolicy(ConfigModel):
    """How the compensator retries a failed delivery (delays in seconds, RocketMQ-style)."""

    delays_s: list[Annotated[StrictFloat, Field(ge=0, le=MAX_RETRY_DELAY_S)]] = Field(
        default_factory=lambda: list(DEFAULT_RETRY_DELAYS_S), max_length=100)
    max_attempts: AttemptCount | None = Field(
        default=None, description="None: until success")
    max_age_s: StrictFloat | None = Field(default=None, gt=0, le=10 * 365 * 24 * 3600.0)
    permanent_status_codes: list[HttpStatus] = Field(
        default_factory=list, max_length=500)


DEFAULT_CIRCUIT_COOLDOWNS_S: tuple[float, ...] = (1, 2, 5, 10, 30, 60)


class CircuitPolicy(ConfigModel):
    """When pushes to a subscriber stop because it seems down, and how it is probed.

    The circuit opens when the first pushes of `open_after_failures` different messages failed
    in a way that says the subscriber is unwell (5xx, 408, 429, timeouts, refused connections)
    since it last answered (failed retries are the same messages failing again), and it has not
    answered for `alive_window_s` (an answer anywhere counts: a dispatcher's push, a retry, a
    replay, from any process). While open, each process probes after each cooldown in turn (the
    last repeats); the first success anywhere closes it."""

    open_after_failures: Integer = Field(default=10, ge=1, le=1_000_000)
    alive_window_s: StrictFloat = Field(
        default=20.0, ge=0, le=24 * 3600.0,
        description="Failures do not open the circuit while the subscriber answered within "
                    "this long (longer than the first retry delay: a subscriber that fails "
                    "first pushes but accepts retries is alive)")
    cooldowns_s: list[Annotated[StrictFloat, Field(ge=0.1, le=24 * 3600.0)]] = Field(
        default_factory=lambda: list(DEFAULT_CIRCUIT_COOLDOWNS_S), min_length=1, max_length=50)


# no \s: JSON Schema's (ECMA-262) and pydantic's (Rust) differ on which characters it takes
FILTER_FIELD_PATTERN = (r"^(biz_id|header:[A-Za-z0-9_.-]+"
                        r"|body:[^.\x00-\x20\x7f-\xa0][^\x00-\x20\x7f-\xa0]*)$")


class MessageFilter(ConfigModel):
    """Deliver only messages whose `field` has one of `values` (compared as text).

    `field` is `biz_id`, `header:<name>` (a message header, e.g. `header:tag`) or
    `body:<dotted.path>` (a field of a JSON body, e.g. `body:order.country`; list items by
    index, `body:items.0.sku`). A message without the field does not match."""

    field: Annotated[str, Field(pattern=FILTER_FIELD_PATTERN, max_length=1000)]
    values: list[Annotated[str, Field(max_length=10_000)]] = Field(min_length=1,
                                                                  max_length=1000)


class RetiredBroker(ConfigModel):
    broker: BrokerKind
    retired_at: datetime


class PublishPolicy(StrEnum):
    ANY = "any"  # every app whose own list names the destination (before teams: the default)
    TEAM = "team"  # the apps of the destination's team, and `publisher_apps`
    LISTED = "listed"  # `publisher_apps` only


class SubscribePolicy(StrEnum):
    ANY = "any"  # every team
    TEAMS = "teams"  # the destination's team and `subscriber_teams`
    APPROVAL = "approval"  # another team asks; the destination's team accepts or declines


class Destination(ConfigModel):
    code: Annotated[str, Field(pattern=CODE_PATTERN)]
    broker: BrokerKind = BrokerKind.DIRECT
    description: str = Field(default="", max_length=2000)
    team: TeamName = PLATFORM_TEAM  # the team that owns it (msgbus/teams.py)
    publishers: PublishPolicy = Field(
        default=PublishPolicy.ANY, description="which producer apps may send to it (a new "
                                               "destination: its team's, `team`)")
    publisher_apps: list[Annotated[str, Field(pattern=NAME_PATTERN)]] = Field(
        default_factory=list, max_length=1000, description="apps that may send to it besides")
    subscribers: SubscribePolicy = Field(
        default=SubscribePolicy.ANY, description="which teams may subscribe to it")
    subscriber_teams: list[TeamName] = Field(
        default_factory=list, max_length=1000, description="teams that may subscribe besides")
    partitions: Integer = Field(default=4, ge=1, le=256,
                                  description="Kafka topic partitions")
    record_rate_per_s: StrictFloat = Field(
        default=0, ge=0, le=10_000_000,
        description="MongoDB record writes/s of each receiver; 0: unlimited")
    # Brokers it used before, oldest first: dispatchers consume each until every subscription
    # that existed then has drained it (dispatcher/drains.py), then it leaves this list.
    retired: list[RetiredBroker] = Field(default_factory=list, max_length=20)
    created_at: datetime = Field(default_factory=utcnow)

    @model_validator(mode="before")
    @classmethod
    def _owner_label_is_a_team(cls, data: Any) -> Any:
        """Documents written before teams name their owner in a free-text label."""
        if isinstance(data, dict) and "owner" in data:
            data = dict(data)
            label = data.pop("owner")
            data.setdefault("team", team_of_label(label or ""))
        return data

    @model_validator(mode="before")
    @classmethod
    def _previous_broker_is_retired(cls, data: Any) -> Any:
        """Documents written before `retired` name one `previous_broker`."""
        if isinstance(data, dict) and "previous_broker" in data:
            data = dict(data)
            previous, changed_at = data.pop("previous_broker"), data.pop("broker_changed_at", None)
            if previous and previous != BrokerKind.DIRECT and "retired" not in data:
                data["retired"] = [{"broker": previous,
                                    "retired_at": changed_at or data.get("created_at")}]
        return data

    def with_broker(self, broker: BrokerKind, now: datetime) -> Destination:
        """This destination switched to `broker` (unchanged when it already uses it): the one
        it leaves is retired (the direct path holds nothing to drain), and `broker`, if it was
        retired, is current again."""
        if broker is self.broker:
            return self
        retired = [r for r in self.retired if r.broker not in (broker, self.broker)]
        if self.broker is not BrokerKind.DIRECT:
            retired.append(RetiredBroker(broker=self.broker, retired_at=now))
        return self.model_copy(update={"broker": broker, "retired": retired})


class PayloadSchema(BaseModel):
    """One version of a destination's payload schema (`schemas` collection; `_id` is
    `<code>/<version>`). Versions count from 1 and are never changed or removed."""

    destination: Annotated[str, Field(pattern=CODE_PATTERN)]
    version: int = Field(ge=1)
    schema_: dict[str, Any] | bool = Field(alias="schema")
    compatibility: SchemaCompatibility = SchemaCompatibility.BACKWARD
    created_at: datetime = Field(default_factory=utcnow)
    created_by: str = ""

    model_config = ConfigDict(populate_by_name=True)

    @property
    def id(self) -> str:
        return payload_schema_id(self.destination, self.version)


def payload_schema_id(destination: str, version: int) -> str:
    return f"{destination}/{version}"


class RetiredCluster(ConfigModel):
    broker: BrokerKind
    cluster: Annotated[str, Field(max_length=100)]
    retired_at: datetime


class RuntimeConfig(ConfigModel):
    """Bus-wide knobs that operators change at runtime through the admin API; services follow
    them within one registry refresh."""

    record_rate_per_s: StrictFloat | None = Field(
        default=None, ge=0, le=10_000_000,
        description="MongoDB record writes/s of each receiver, all destinations; 0: unlimited;"
                    " None: each receiver's MSGBUS_RECEIVER_RECORD_RATE_PER_S")
    active_clusters: dict[BrokerKind, Annotated[str, Field(max_length=100)]] = Field(
        default_factory=dict,
        description="Per broker kind, the cluster receivers publish to (default: the first "
                    "configured)")
    # clusters receivers published to before, oldest first (the newest 20): ordered
    # subscriptions drain each before they consume the active one (dispatcher/drains.py)
    retired_clusters: list[RetiredCluster] = Field(default_factory=list, max_length=20)
    updated_at: datetime = Field(default_factory=utcnow)

    def active_cluster(self, kind: BrokerKind, configured: list[str]) -> str | None:
        """The cluster of `kind` receivers publish to, of those `configured` (in order)."""
        wanted = self.active_clusters.get(kind)
        if wanted is not None and wanted in configured:
            return wanted
        return configured[0] if configured else None

    def with_active_cluster(self, kind: BrokerKind, cluster: str, configured: list[str],
                            now: datetime) -> RuntimeConfig:
        """Receivers switch `kind` to `cluster`; the one they leave is retired."""
        previous = self.active_cluster(kind, configured)
        if previous == cluster:
            return self
        retired = [r for r in self.retired_clusters
                   if not (r.broker is kind and r.cluster in (cluster, previous))]
        if previous is not None:
            retired.append(RetiredCluster(broker=kind, cluster=previous, retired_at=now))
        return self.model_copy(update={
            "active_clusters": self.active_clusters | {kind: cluster},
            "retired_clusters": retired[-20:]})


def new_signing_secret() -> str:
    """A Standard Webhooks secret: `whsec_` + base64 of 24 random bytes."""
    import base64

    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


class SubscriptionSettings(ConfigModel):
    """What an operator sets of a subscription (the admin API's request body)."""

    url: HttpUrl = Field(description="http or https; at most 2,083 characters also in the form "
                                     "it is stored in (percent-encoded, '/' after a bare host)")
    max_concurrency: Integer = Field(default=16, ge=1, le=1024)
    max_rate_per_s: Count100k | None = Field(
        default=None,
        description="At most this many pushes begin in any second, from all processes "
                    "together (dispatchers, retries, replays); None: no limit")
    timeout_ms: Integer = Field(default=5000, ge=10, le=300_000)
    retry_policy: RetryPolicy = Field(default_factory=RetryPolicy)
    circuit: CircuitPolicy = Field(default_factory=CircuitPolicy)
    paused: StrictBool = False
    max_in_flight: Count100k | None = Field(
        default=None,
        description="Messages taken from the broker and not yet done (pushing, waiting for "
                    "a slot or for their turn); default max(64, 4 * max_concurrency)")
    ordered_by_biz_id: StrictBool = Field(
        default=False,
        description="Messages with the same biz_id are pushed in the order received, the next "
                    "only after the previous succeeded or was parked (failures are retried "
                    "in place by the dispatcher); different biz_ids run in parallel")
    filters: list[MessageFilter] = Field(
        default_factory=list, max_length=100,
        description="All must match for a message to be pushed; the others are recorded as "
                    "skipped")
    batch_max_messages: BatchSize | None = Field(
        default=None,
        description="Push up to this many messages in one POST, a CloudEvents batch "
                    "(application/cloudevents-batch+json); None or 1: one message per push")
    batch_max_bytes: Integer = Field(
        default=1024 * 1024, ge=1024, le=MAX_BATCH_BYTES,
        description="A batch's body stays within this many bytes (a single larger message "
                    "goes alone)")
    batch_max_wait_ms: Integer = Field(
        default=100, ge=0, le=60_000,
        description="A batch goes at the latest this long after its first message was taken")
    delay_s: StrictFloat = Field(
        default=0.0, ge=0, le=MAX_DELIVERY_DELAY_S,
        description="Each message is pushed no sooner than this long after it was accepted "
                    "(and not before its own deliver_at)")
    delivery_objective_s: StrictFloat = Field(
        default=DEFAULT_DELIVERY_OBJECTIVE_S, ge=1, le=7 * 24 * 3600.0,
        description="A message should be delivered within this long after its delay_s: when "
                    "the oldest undelivered one is older, the owning team is told "
                    "(delivery.late) and the MsgbusUndeliveredOld alert fires")
    dispatchers: Annotated[int, Field(ge=1, le=1000), *_WHOLE] | None = Field(
        default=DEFAULT_DISPATCHERS,
        description="How many dispatcher instances serve it (consume its messages and push "
                    "them), chosen among the live ones and moved when one comes or goes; "
                    "None: every instance. A direct destination's are served by every one")
    auth: PushAuth | None = Field(
        default=None,
        description="How pushes authenticate besides their signature: static headers, Basic, "
                    "OAuth2 client credentials, TLS client certificate and CA; secret values "
                    "are answered as '********', which a PUT may send back to keep them")

    @model_validator(mode="after")
    def _tls_over_https(self) -> SubscriptionSettings:
        if self.auth is not None and self.auth.tls is not None and self.url.scheme != "https":
            raise ValueError("auth.tls applies to an https url only")
        return self

    def shown(self) -> dict[str, Any]:
        """As answers and the audit log show it: no signing secret, other secrets masked."""
        shown = self.model_dump(mode="json", exclude={"signing_secrets"})
        if self.auth is not None:
            shown["auth"] = self.auth.masked().model_dump(mode="json")
        return shown

    @model_validator(mode="after")
    def _batch_fits_in_flight(self) -> SubscriptionSettings:
        if (self.batch_max_messages is not None and self.max_in_flight is not None
                and self.max_in_flight < self.batch_max_messages):
            raise ValueError(
                f"max_in_flight ({self.max_in_flight}) must be at least batch_max_messages "
                f"({self.batch_max_messages}): a batch is gathered from the messages in flight")
        return self

    @property
    def late_after_s(self) -> float:
        """The oldest undelivered message's age past which delivery is late."""
        return self.delay_s + self.delivery_objective_s

    @property
    def batched(self) -> bool:
        """Pushes carry CloudEvents batches (of one message or more)."""
        return self.batch_max_messages is not None and self.batch_max_messages > 1


class Subscription(SubscriptionSettings):
    destination: Annotated[str, Field(pattern=CODE_PATTERN)]
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    # the team that owns it; None (stored before teams): its destination's team
    team: TeamName | None = None
    # "whsec_..." as made; stored and carried sealed ("mbsealed:...", msgbus/sealing.py)
    signing_secrets: list[Annotated[str, Field(max_length=400)]] = Field(
        default_factory=lambda: [new_signing_secret()], max_length=10)
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    # after a rotation, pushes are signed with the previous secret (signing_secrets[1:]) too,
    # until this time; None: until an admin drops it
    previous_secret_until: datetime | None = None
    # an operator skipped the backlog: what was received before this is recorded as skipped
    skip_before: datetime | None = None
    skip_reason: str = Field(default="", max_length=1000)

    @field_validator("signing_secrets")
    @classmethod
    def _secrets_have_prefix(cls, value: list[str]) -> list[str]:
        if not value or not all(s.startswith(("whsec_", "mbsealed:")) for s in value):
            raise ValueError("signing secrets must be a non-empty list of 'whsec_...' values")
        return value

    @property
    def id(self) -> str:
        return subscription_id(self.destination, self.name)

    def owning_team(self, destination_teams: Mapping[str, str]) -> str:
        """The team that owns it: its own, or (stored before teams) its destination's, from
        `destination_teams` (code -> team)."""
        return self.team or destination_teams.get(self.destination, PLATFORM_TEAM)

    def secrets_signing_at(self, unix_s: float) -> list[str]:
        """The secrets a push at `unix_s` is signed with: the current one, and the previous
        one while a rotation's overlap lasts. In whole seconds, as the signed timestamp is: an
        overlap of 0 ends at once, not at the next second."""
        until = self.previous_secret_until
        if until is not None and unix_s >= int(until.timestamp()):
            return self.signing_secrets[:1]
        return self.signing_secrets

    @property
    def in_flight_budget(self) -> int:
        """A batch subscription's default leaves room for a batch per pusher and the next
        one being gathered."""
        if self.max_in_flight:
            return self.max_in_flight
        batches = (self.max_concurrency + 1) * (self.batch_max_messages or 1) if self.batched else 0
        return min(100_000, max(64, 4 * self.max_concurrency, batches))


def subscription_id(destination: str, name: str) -> str:
    return f"{destination}/{name}"


@dataclass(slots=True)
class AttemptResult:
    """The outcome of one push of one message to one subscriber. Never an exception."""

    message_id: str
    subscription: str
    attempt: int
    started_at: datetime
    latency_ms: float
    status_code: int | None = None
    error: str | None = None
    instance: str = ""
    retry_after_s: float | None = None
    batch_id: str | None = None  # the batch push that carried it (batch subscriptions)
    # the first bytes of the subscriber's answer to a failed push (MSGBUS_PUSH_ANSWER_KEEP_BYTES)
    answer: str | None = None

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def delivery_id(message_id: str, sub_id: str) -> str:
    """The id of one message's delivery to one subscription (its deliveries document)."""
    return f"{message_id}|{sub_id}"


@dataclass(slots=True)
class DeliveryOutcome:
    """What a delivery attempt changes in the delivery state: the attempt itself, and when to
    retry (`next_attempt_at`) or that the policy gave up (`parked`)."""

    result: AttemptResult
    destination: str
    created_at: datetime
    biz_id: str | None = None
    next_attempt_at: datetime | None = None
    parked: bool = False
    retrying_in_place: bool = False  # an ordered subscription's dispatcher retries it itself
    skipped: bool = False  # filtered out: no push was made; `result` says why
    # not pushed before this (deliver_at, delay_s): no push was made, the state becomes
    # scheduled (`next_attempt_at`: when the compensator pushes it; None: held in place)
    scheduled_for: datetime | None = None

    @property
    def pushed(self) -> bool:
        """Whether a push was made (an attempt to append to the trace)."""
        return not self.skipped and self.scheduled_for is None


class ReplayState(StrEnum):
    PLANNED = "planned"  # counted (dry run), not started
    RUNNING = "running"
    PAUSED = "paused"
    CANCELLED = "cancelled"
    DONE = "done"


REPLAY_FINAL_STATES = (ReplayState.CANCELLED, ReplayState.DONE)
MAX_REPLAY_RATE_PER_S = 10_000.0


class ReplaySpec(ConfigModel):
    """What a replay re-delivers: the messages of `destination` created in [since, until), to
    the named subscriptions (all of the destination's when omitted), optionally only those of
    one biz_id and only deliveries now in one of `statuses`; at most `rate_per_s` pushes/s."""

    destination: Annotated[str, Field(pattern=CODE_PATTERN)]
    subscriptions: list[Annotated[str, Field(pattern=NAME_PATTERN)]] | None = Field(
        default=None, description="subscription names; None: every subscription of the "
                                  "destination when the job is created")
    since: Timestamp
    until: Timestamp
    biz_id: str | None = Field(default=None, max_length=256)
    statuses: list[DeliveryStatus] | None = Field(
        default=None, description="only deliveries in one of these states (e.g. failed, "
                                  "parked); None: every message in the range")
    rate_per_s: StrictFloat = Field(default=100.0, gt=0, le=MAX_REPLAY_RATE_PER_S)

    @field_validator("until")
    @classmethod
    def _range_not_empty(cls, until: datetime, info: object) -> datetime:
        since = getattr(info, "data", {}).get("since")
        if since is not None and until <= since:
            raise ValueError("until must be after since")
        return until


class ReplayJob(BaseModel):
    """A replay job as stored (`replays` collection; `_id` is its id)."""

    replay_id: str = Field(alias="_id")
    spec: ReplaySpec
    subscriptions: list[str]
    state: ReplayState
    planned: int = Field(ge=0)
    done: int = Field(ge=0)
    position: dict[str, Any] | None
    created_at: datetime
    requested_by: str


class ProducerApp(BaseModel):
    """A producer app as stored (`apps` collection; `_id` is its name): the SHA-256 of each of
    its API keys and the destinations it may send to."""

    name: Annotated[str, Field(alias="_id", pattern=NAME_PATTERN)]
    key_hashes: list[Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]]
    destinations: list[Annotated[str, Field(pattern=APP_DESTINATION_PATTERN)]] = Field(
        min_length=1)
    created_at: datetime
    revoked_at: datetime | None = None
    team: TeamName = PLATFORM_TEAM  # stored before teams: the bus's own until given away
