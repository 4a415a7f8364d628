"""Typed settings, read from `MSGBUS_*` environment variables.

One settings object per service, built at the entry point and passed in. Connection settings
are shared (`MSGBUS_MONGO_URI`, ...); a service's own knobs carry its prefix
(`MSGBUS_RECEIVER_PORT`, `MSGBUS_DISPATCHER_INSTANCE`, ...).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from msgbus.delivery.proxy import PushProxy
from msgbus.egress import EgressPolicy
from msgbus.models import DEFAULT_CLUSTER, BrokerKind
from msgbus.sealing import SecretKeyError, SecretKeys, keys_from

# the push HTTP clients (msgbus/delivery/senders.py `make_sender`): h1, or aiohttp as a fallback
HttpClient = Literal["h1", "aiohttp"]
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})  # listening on every address


class ConnectionSettings(BaseSettings):
    """Where the shared dependencies live. Empty broker URLs mean that broker is not configured."""

    model_config = SettingsConfigDict(env_prefix="MSGBUS_", extra="ignore")

    mongo_uri: str = "mongodb://127.0.0.1:27017"
    mongo_db: str = "msgbus"
    # scans across subscriptions walk the index (MongoDB); false: look at each subscription,
    # for the development stand-in, whose planner scans the whole collection for the walk
    # (msgbus/store/skipscan.py)
    mongo_index_skip_scans: bool = True
    kafka_bootstrap: str = ""
    rabbitmq_url: str = ""
    # Several clusters of a broker kind (e.g. a primary and a standby in two data centres), as
    # JSON {"name": ["node", ...]}: Kafka nodes are host:port, RabbitMQ nodes amqp:// URLs. The
    # first cluster is where receivers publish until the admin API switches them. Alone,
    # `kafka_bootstrap` / `rabbitmq_url` define one cluster named "default".
    kafka_clusters: dict[str, list[str]] = Field(default_factory=dict)
    rabbitmq_clusters: dict[str, list[str]] = Field(default_factory=dict)
    # Management API per RabbitMQ cluster, e.g. {"default": "http://user:pass@mq:15672"}
    # (broker health metrics); unset: each amqp:// node's host, credentials, port 15672.
    rabbitmq_management_urls: dict[str, str] = Field(default_factory=dict)
    # How many copies of every message the brokers keep (msgbus/replication.py). Kafka topics
    # are created with this replication factor and min.insync.replicas (unset: not sent, the
    # broker's defaults apply); producers use acks=all. A subscription's RabbitMQ queue is
    # declared classic or quorum (replicated on the cluster's nodes, Raft). Each applies when
    # the topic or queue is created; the broker-health monitor and the admin report what an
    # existing one has (docs/operations.md: migrating).
    kafka_replication_factor: int | None = Field(default=None, ge=1)
    kafka_min_insync_replicas: int | None = Field(default=None, ge=1)
    rabbitmq_queue_type: Literal["classic", "quorum"] = "classic"
    # Shared secret of the internal receiver -> dispatcher ("direct") endpoint. The CLI fills it
    # from <state_dir>/internal-token when the environment does not set it.
    internal_token: SecretStr = SecretStr("")
    # Secrets stored encrypted (msgbus/sealing.py): "id:key,id:key", the newest first, or the
    # same text in a file. The CLI keeps one in <state_dir>/secret-keys when neither is set.
    secret_keys: SecretStr = SecretStr("")
    secret_key_file: str = ""
    state_dir: Path = Path(".msgbus")
    config_refresh_s: float = 2.0
    # the admin UI's address as people reach it: the links in teams' notifications
    ui_url: str = ""
    # a kind of event of a subscription is told to its team at most once per this long
    notify_cooldown_s: float = Field(default=600.0, gt=0)
    # Dispatchers and compensators split each subscription's max_concurrency between them
    # (msgbus/delivery/shares.py): how often each renews its lease and settles its shares, and
    # how long a process that stops renewing keeps its share before the others may take it.
    share_heartbeat_s: float = Field(default=1.0, gt=0)
    share_lease_s: float = Field(default=5.0, gt=0)
    # The host other processes (the admin's Services panel) reach this service's /health at,
    # advertised in its heartbeat (`instances`). Empty: the address it listens on, or the
    # machine's hostname when it listens on every address (0.0.0.0, ::). On Kubernetes, the
    # pod IP (deploy/k8s: the downward API).
    advertised_host: str = ""

    def health_url(self, bind_host: str, port: int) -> str | None:
        """Where a service listening on bind_host:port answers /health for the others; None
        for port 0 (the port is known only once the server has bound it)."""
        if port == 0:
            return None
        host = self.advertised_host or (
            socket.gethostname() if bind_host in WILDCARD_HOSTS else bind_host)
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/health"

    def require_internal_token(self) -> str:
        """The token receivers and dispatchers authenticate the direct path with; a service
        that uses the direct path does not start without one."""
        token = self.internal_token.get_secret_value()
        if not token:
            raise ValueError("MSGBUS_INTERNAL_TOKEN is not set (the direct path needs it)")
        return token

    def clusters(self, kind: BrokerKind) -> dict[str, list[str]]:
        """The configured clusters of a broker kind, name -> node addresses, in order."""
        if kind is BrokerKind.KAFKA:
            named, single = self.kafka_clusters, self.kafka_bootstrap.split(",")
        elif kind is BrokerKind.RABBITMQ:
            named, single = self.rabbitmq_clusters, self.rabbitmq_url.split(",")
        else:
            return {}
        clusters = {name: nodes for name, nodes in named.items() if nodes}
        nodes = [node.strip() for node in single if node.strip()]
        if nodes and DEFAULT_CLUSTER not in clusters:
            clusters = {DEFAULT_CLUSTER: nodes, **clusters}
        return clusters


def sealing_keys(conn: ConnectionSettings) -> SecretKeys:
    """The keys that seal and open stored secrets; a clear error when none are set (the
    admin, dispatchers and compensators need them)."""
    keys = keys_from(conn.secret_keys.get_secret_value(), conn.secret_key_file or None)
    if keys is None:
        raise SecretKeyError(
            "MSGBUS_SECRET_KEYS (or MSGBUS_SECRET_KEY_FILE) is not set: stored secrets are "
            "sealed with it; `msgbus secrets new-key` prints one (docs/operations.md)")
    return keys


class PushSettings(BaseSettings):
    """What every push client (dispatcher, compensator, the admin's test push) shares: the
    `push` of their settings, built with them at the entry point."""

    model_config = SettingsConfigDict(env_prefix="MSGBUS_PUSH_", extra="ignore")

    # the first bytes of a subscriber's answer to a failed push, kept with the attempt (0: none)
    answer_keep_bytes: int = Field(default=1024, ge=0, le=65536)
    # The egress policy (msgbus/egress.py): internal addresses are refused unless allowed here;
    # comma-separated CIDRs, e.g. "10.20.0.0/16,fd00:1::/64". A denial wins over an allowance.
    allow_networks: str = ""
    deny_networks: str = ""
    # The company's HTTP proxy for every push (msgbus/delivery/proxy.py), e.g.
    # "http://proxy.corp:3128" (a password in it stays secret), and the hosts reached directly
    # (curl's NO_PROXY form: "internal.corp,10.0.0.0/8"). With a proxy the aiohttp client pushes.
    proxy: SecretStr = SecretStr("")
    no_proxy: str = ""

    def egress_policy(self) -> EgressPolicy:
        return EgressPolicy.parse(self.allow_networks, self.deny_networks)

    def push_proxy(self) -> PushProxy | None:
        return PushProxy.parse(self.proxy.get_secret_value(), self.no_proxy)

    @model_validator(mode="after")
    def _networks_parse(self) -> PushSettings:
        self.egress_policy()  # a ValueError naming the setting, at start-up
        self.push_proxy()
        return self


class TracingSettings(BaseSettings):
    """OpenTelemetry spans of every service (msgbus/telemetry.py); off by default."""

    model_config = SettingsConfigDict(env_prefix="MSGBUS_TRACING_", extra="ignore")

    enabled: bool = False
    # otlp: OTLP/HTTP, configured by the standard OTEL_EXPORTER_OTLP_* variables; console:
    # each span printed on stdout as JSON
    exporter: Literal["otlp", "console"] = "otlp"


class ReceiverSettings(BaseSettings):
    # A renamed setting lists its variables, the current name first, then the one before 0.2
    # (docs/operations.md, "Renamed in 0.2"); in code it is given by its field name.
    model_config = SettingsConfigDict(env_prefix="MSGBUS_RECEIVER_", extra="ignore",
                                      validate_by_name=True)

    host: str = "127.0.0.1"
    port: int = 8080
    max_message_bytes: int = 1024 * 1024
    max_batch_count: int = 500
    max_batch_bytes: int = 8 * 1024 * 1024
    buffer_dir: Path | None = None  # default: <state_dir>/receiver-buffer
    buffer_max_bytes: int = 2 * 1024**3
    orphan_scan_s: float = 30.0  # how often to look for buffer slots dead receivers left
    orphan_min_idle_s: float = 10.0  # a slot untouched that long can be adopted
    # how long the receiver remembers accepted message ids, to answer a client's re-send
    # "duplicate" instead of publishing it again (per receiver instance)
    dedupe_window_s: float = 600.0
    # also across receiver replicas: each publish batch's ids are claimed in MongoDB first
    # (receiver/dedupe.py: one write per batch); off, a re-send that reaches another replica
    # may be delivered twice
    dedupe_across_receivers: bool = True
    mongo_batch_size: int = 500
    # MongoDB record writes per second of this receiver, all destinations (0: unlimited);
    # the admin API's runtime settings override it.
    record_rate_per_s: float = 0
    publish_batch_size: int = 500
    # "all", "1" or "0": what a Kafka publish waits for; min.insync.replicas holds only with
    # "all" (checked below), and the idempotent producer needs it too
    kafka_acks: str = "all"
    # The longest a publish waits for the broker's acknowledgement (a hung broker): then its
    # messages go the direct path. librdkafka's message.timeout.ms; RabbitMQ's confirms.
    kafka_publish_timeout_ms: int = Field(default=30_000, ge=1000)
    rabbitmq_confirm_timeout_s: float = Field(default=10.0, gt=0)
    # Where the buffer is flushed into the brokers and MongoDB: "process" (a flush process
    # beside each receiver process, so that flush work never delays an answer to a producer)
    # or "inline" (on the receiver's own event loop: one process, e.g. `msgbus up`).
    flusher: Literal["process", "inline"] = Field(
        default="process",
        validation_alias=AliasChoices("MSGBUS_RECEIVER_FLUSHER", "MSGBUS_RECEIVER_DRAINER"))
    # Added to the flush process's nice value: when CPU is short, answering producers comes
    # first and the buffer absorbs the difference (the flush catches up when load drops).
    flush_nice: int = Field(
        default=10, ge=0, le=19,
        validation_alias=AliasChoices("MSGBUS_RECEIVER_FLUSH_NICE", "MSGBUS_RECEIVER_DRAIN_NICE"))
    # Where the direct path hands messages (a dispatcher's internal endpoint).
    dispatcher_url: str = "http://127.0.0.1:8081"
    connections: ConnectionSettings = Field(default_factory=ConnectionSettings)

    @model_validator(mode="after")
    def _acks_keep_the_copies(self) -> ReceiverSettings:
        if (self.connections.kafka_min_insync_replicas is not None
                and self.kafka_acks not in ("all", "-1")):
            raise ValueError("MSGBUS_KAFKA_MIN_INSYNC_REPLICAS needs "
                             f"MSGBUS_RECEIVER_KAFKA_ACKS=all, not {self.kafka_acks!r}")
        return self


class DispatcherSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MSGBUS_DISPATCHER_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8081
    instance: str = ""  # default: hostname-pid
    trace_dir: Path | None = None  # default: <state_dir>/dispatcher-trace
    trace_batch_size: int = 1000
    direct_queue_size: int = 10_000
    # Messages the broker hands out again (after a restart or a rebalance) are looked up in
    # MongoDB first and not pushed when already delivered, and so are those older than this
    # (a backlog the compensator may have swept): keep it below the compensator's
    # sweep_after_s. dispatcher/redelivery.py.
    check_delivered_after_s: float = Field(default=60.0, ge=0)
    # The longest a Kafka fetch waits for data (librdkafka's fetch.wait.max.ms); a broker
    # answers earlier as soon as data is ready, so this bounds an idle consumer's wait, not a
    # message's latency. Each idle consumer sends 1000/this fetches a second: lower it only
    # where the brokers take that load (docs/decisions.md).
    kafka_fetch_wait_ms: int = Field(default=500, ge=1, le=10_000)
    # How often the backlog and oldest-undelivered-age gauges are read from MongoDB.
    backlog_interval_s: float = Field(default=15.0, gt=0)
    # how often deleted subscriptions' and destinations' consumer groups, queues, topics and
    # exchanges are looked for and removed (dispatcher/cleanup.py)
    cleanup_interval_s: float = Field(default=10.0, gt=0)
    # After a broker switch, how soon and how often dispatchers look whether the retired broker
    # is drained (dispatcher/drains.py); the settle time is at least 3 registry refreshes: a
    # publish already under way at the switch may still land in the old broker
    drain_settle_s: float = Field(default=30.0, ge=0)
    drain_check_interval_s: float = Field(default=5.0, gt=0)
    # Push HTTP client: h1 (several times aiohttp's pushes per CPU-second, bench/RESULTS.md) or
    # aiohttp, the fallback.
    http_client: HttpClient = "h1"
    # How often the brokers' own health (dispatcher/brokerhealth.py) is read; 0: never.
    broker_health_interval_s: float = Field(default=30.0, ge=0)
    push: PushSettings = Field(default_factory=PushSettings)
    connections: ConnectionSettings = Field(default_factory=ConnectionSettings)


class CompensatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MSGBUS_COMPENSATOR_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8082
    instance: str = ""  # names this compensator in attempts and leases; default host-pid
    http_client: HttpClient = "h1"
    # one scan across subscriptions looks for due retries and scheduled deliveries this often
    scan_interval_s: float = 1.0
    # most deliveries one claim takes (also at most 4 x the subscription's max_concurrency)
    claim_batch: int = 256
    # a claim's lease: this, plus the time the batch's pushes may take at the subscription's
    # timeout; a compensator that dies holds its claims no longer than that
    lease_s: float = 60.0
    # a delivery still pending after this long is pushed by the compensator (its dispatcher
    # died, its broker lost it, the direct path failed); keep it well above the normal
    # accept-to-delivery time, or slow backlogs get pushed twice
    sweep_after_s: float = 600.0
    sweep_interval_s: float = 30.0
    # how often the messages that got an outcome leave the pending batches (what the backlog
    # gauges count); each pass reads the state of what was delivered since the last
    settle_interval_s: float = Field(default=5.0, gt=0)
    stats_interval_s: float = 15.0  # the retries-due / parked / oldest-retry gauges
    replay_poll_s: float = 2.0  # how often idle compensators look for replay jobs to run
    push: PushSettings = Field(default_factory=PushSettings)
    connections: ConnectionSettings = Field(default_factory=ConnectionSettings)


class OidcSettings(BaseSettings):
    """Company sign-in through an OpenID Connect provider (Okta, Entra ID, Keycloak, Google):
    off while `issuer` is empty. admin/oidc.py has the flow."""

    model_config = SettingsConfigDict(env_prefix="MSGBUS_OIDC_", extra="ignore")

    issuer: str = ""  # e.g. https://company.okta.com; its /.well-known/openid-configuration
    client_id: str = ""
    client_secret: SecretStr = SecretStr("")
    # the admin's address as the browser reaches it: the callback is <base_url>/ui/oidc/callback
    base_url: str = ""
    scopes: str = "openid profile groups offline_access"
    prompt: str = ""  # e.g. "consent": some providers issue refresh tokens only then
    username_claim: str = "preferred_username"  # lower-cased: the bus's user name
    groups_claim: str = "groups"
    # provider group -> "team:role" (role: owner, maintainer or viewer); a person's teams follow
    # their groups at every sign-in and refresh
    team_map: dict[str, str] = Field(default_factory=dict)
    admin_groups: list[str] = Field(default_factory=list)  # bus-wide admins
    operator_groups: list[str] = Field(default_factory=list)  # bus-wide operators
    refresh_s: float = Field(default=300.0, gt=0)  # how often a session's groups are read again

    @property
    def enabled(self) -> bool:
        return bool(self.issuer)


class AdminSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MSGBUS_ADMIN_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8083
    # The bootstrap bearer token (role admin): first set-up and automation; users log in with a
    # password or use API tokens of their own. The CLI fills it from <state_dir>/admin-token
    # when the environment does not set it.
    token: SecretStr = SecretStr("")
    # Signs session cookies; the CLI keeps one in <state_dir>/admin-session-secret. Empty: a
    # random one per process (sessions then end when the admin restarts).
    session_secret: SecretStr = SecretStr("")
    session_ttl_s: float = 8 * 3600
    # Failed sign-ins (msgbus/throttle.py): a user at one address, or an address, is locked
    # for this long after too many, twice as long after each further one, up to the maximum.
    # Behind a proxy, uvicorn's FORWARDED_ALLOW_IPS names it, so that the caller's address is
    # the one the proxy forwards (X-Forwarded-For), not the proxy's.
    signin_lock_first_s: float = Field(default=30.0, gt=0)
    signin_lock_max_s: float = Field(default=900.0, gt=0)
    # failures of any users (and wrong API tokens) from one address before it is locked: raise
    # it where many people share one address (an office behind NAT)
    signin_address_lock_after: int = Field(default=20, ge=1)
    push: PushSettings = Field(default_factory=PushSettings)  # the test push's
    oidc: OidcSettings = Field(default_factory=OidcSettings)
    connections: ConnectionSettings = Field(default_factory=ConnectionSettings)


FORMER_NODE_RESCUER_PREFIX = "MSGBUS_SPOOL_DRAINER_"  # before 0.2, still read


class NodeRescuerSettings(BaseSettings):
    """`msgbus node-rescuer`: one per node (the Kubernetes DaemonSet), over the node's root.

    Layout under `root`: `receiver-buffer/` is the receivers' shared buffer root (their
    MSGBUS_RECEIVER_BUFFER_DIR), `spool/` holds client spools, e.g. `spool/<app>/<pod>/`.
    Until 0.2 it was `msgbus spool-drainer`: its MSGBUS_SPOOL_DRAINER_* variables are still
    read, after these (docs/operations.md, "Renamed in 0.2").
    """

    model_config = SettingsConfigDict(env_prefix="MSGBUS_NODE_RESCUER_", extra="ignore",
                                      validate_by_name=True)

    host: str = "127.0.0.1"
    port: int = 8085  # /health and /metrics
    root: Path = Path("/var/lib/msgbus")
    # A queue nobody holds must also be this long unwritten: a pod restarting on its node takes
    # its own queue back first.
    min_idle_s: float = Field(default=600.0, ge=0)
    scan_interval_s: float = Field(default=60.0, gt=0)
    # Where client spools are sent; a spool under spool/<app>/ is sent with the key in
    # <api_keys_dir>/<app> when that file exists, else with `api_key`.
    receiver_url: str = ""
    api_key: SecretStr = SecretStr("")
    api_keys_dir: Path | None = None
    rescue_timeout_s: float = Field(  # per client spool
        default=300.0, gt=0,
        validation_alias=AliasChoices("MSGBUS_NODE_RESCUER_RESCUE_TIMEOUT_S",
                                      "MSGBUS_SPOOL_DRAINER_DRAIN_TIMEOUT_S"))

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        former = EnvSettingsSource(settings_cls, env_prefix=FORMER_NODE_RESCUER_PREFIX)
        return init_settings, env_settings, former, dotenv_settings, file_secret_settings
