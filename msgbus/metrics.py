"""Prometheus metrics of every service. Names follow `msgbus_<what>_<unit>`.

A service made of several processes (`msgbus receiver`: workers and their flush processes) sets
PROMETHEUS_MULTIPROC_DIR before anything imports prometheus_client: every process then writes
its values there and /metrics of any of them reports all (prometheus_client's multiprocess mode;
each gauge says how the processes' values combine).
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

MULTIPROCESS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"

MESSAGES_ACCEPTED = Counter(
    "msgbus_messages_accepted_total", "Messages accepted by the receiver", ["destination"])
MESSAGES_DUPLICATE = Counter(
    "msgbus_messages_duplicate_total",
    "Messages the receiver had already accepted (client re-sends), answered 'duplicate'",
    ["destination"])
DEDUPE_UNCHECKED = Counter(
    "msgbus_dedupe_unchecked_total",
    "Messages published without the cross-receiver duplicate check (MongoDB did not answer)")
MONGO_AVAILABLE = Gauge(
    "msgbus_mongo_available",
    "1 while the process's MongoDB gate is open (calls go through), 0 while it is closed "
    "(callers take their outage path at once and one probe looks for MongoDB's return)",
    ["component"], multiprocess_mode="livemin")
MONGO_GATE_CLOSED = Counter(
    "msgbus_mongo_gate_closed_total",
    "Times the process's MongoDB gate closed after a timeout or a connection error",
    ["component"])
MONGO_CALLS_SKIPPED = Counter(
    "msgbus_mongo_calls_skipped_total",
    "MongoDB calls not made because the gate was closed, by caller (each took its outage path)",
    ["component", "caller"])
MESSAGES_REJECTED = Counter(
    "msgbus_messages_rejected_total",
    "Messages (or requests) the receiver refused, by destination ('' when unknown) and reason",
    ["destination", "reason"])
REQUEST_LATENCY = Histogram(
    "msgbus_receiver_request_seconds", "Receiver request latency by endpoint and status class",
    ["endpoint", "status"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
PUBLISHED = Counter(
    "msgbus_published_total", "Publish outcomes by broker and cluster",
    ["broker", "cluster", "outcome"])
PUBLISH_LATENCY = Histogram(
    "msgbus_publish_latency_seconds", "Time a broker takes to confirm one publish batch",
    ["broker", "cluster"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
DIRECT_FALLBACKS = Counter(
    "msgbus_direct_fallbacks_total",
    "Messages a broker refused or could not take that went the direct path instead",
    ["destination", "broker"])
BUFFER_DEPTH = Gauge(
    "msgbus_local_buffer_entries", "Entries waiting in a local LMDB buffer", ["service", "queue"],
    multiprocess_mode="livesum")
BUFFER_OLDEST_AGE = Gauge(
    "msgbus_local_buffer_oldest_age_seconds",
    "Age of the oldest entry waiting in a local LMDB buffer (0 when empty)", ["service", "queue"],
    multiprocess_mode="livemax")
BUFFER_BYTES = Gauge(
    "msgbus_local_buffer_bytes", "Bytes used by a local LMDB buffer, and its limit",
    ["service", "kind"], multiprocess_mode="livesum")
RECORD_RATE_LIMIT = Gauge(
    "msgbus_record_rate_limit_per_second",
    "The MongoDB record write rate in force (0 = unlimited), globally ('*') or per destination",
    ["destination"], multiprocess_mode="livemax")
CONFIG_INVALID_DOCUMENTS = Gauge(
    "msgbus_config_invalid_documents",
    "Stored configuration documents that do not validate and are skipped (listed by the "
    "admin's GET /v1/invalid-documents), by collection", ["collection"],
    multiprocess_mode="livemax")
CAP_SHARE = Gauge(
    "msgbus_subscription_cap_share",
    "The pushes this process may have in flight to the subscription: its share of the "
    "subscription's max_concurrency, which all processes pushing to it split",
    ["subscription", "component"], multiprocess_mode="livesum")
RATE_SHARE = Gauge(
    "msgbus_subscription_rate_share",
    "The pushes per second this process may begin to the subscription: its share of the "
    "subscription's max_rate_per_s", ["subscription", "component"], multiprocess_mode="livesum")
ASSIGNMENT_MOVES = Counter(
    "msgbus_assignment_moves_total",
    "Subscriptions this dispatcher began (in) or stopped (out) serving because dispatchers "
    "came or went (msgbus/assignment.py)", ["direction"])
PUSH_TOKEN_FETCHES = Counter(
    "msgbus_push_token_fetches_total",
    "OAuth2 tokens fetched for subscriptions' pushes (auth.oauth2), by token endpoint host and "
    "outcome (ok, failed); one per process and credentials while a token lasts",
    ["host", "outcome"])
PUSHES = Counter(
    "msgbus_pushes_total",
    "Pushes to subscribers by outcome: delivered, failed (to be retried), parked (given up)",
    ["subscription", "outcome"])
SKIPPED = Counter(
    "msgbus_messages_skipped_total", "Messages a subscription's filters left out (not pushed)",
    ["subscription"])
SCHEDULED = Counter(
    "msgbus_deliveries_scheduled_total",
    "Deliveries not pushed at once because they are due later (deliver_at, delay_s)",
    ["subscription"])
REDELIVERIES_SKIPPED = Counter(
    "msgbus_redeliveries_skipped_total",
    "Messages a broker handed out again (or the compensator pushed meanwhile) that the "
    "dispatcher delivered itself or that MongoDB marks delivered: not pushed again",
    ["subscription"])
SLOT_WAIT = Histogram(
    "msgbus_push_slot_wait_seconds",
    "Time a message waited for one of its subscription's concurrency slots (semaphore)",
    ["subscription"],
    buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30))
PAUSED_PARTITIONS = Gauge(
    "msgbus_paused_partitions",
    "Kafka partitions a subscription's consumers paused because its in-flight budget is full",
    ["subscription"], multiprocess_mode="livesum")
SUBSCRIPTION_INFO = Gauge(
    "msgbus_subscription_info",
    "1 for every subscription a dispatcher knows, labelled with its destination and the team "
    "that owns it: alerts join on it (group_left) to carry a team label",
    ["subscription", "destination", "team"], multiprocess_mode="livemax")
DELIVERY_OBJECTIVE = Gauge(
    "msgbus_subscription_late_after_seconds",
    "The oldest undelivered message's age past which the subscription's delivery is late: "
    "its delay_s plus its delivery_objective_s (the MsgbusUndeliveredOld alert compares)",
    ["subscription"], multiprocess_mode="livemax")
CIRCUIT_OPEN = Gauge(
    "msgbus_subscription_circuit_open",
    "1 while pushes to the subscription are stopped because it kept failing (probed now and "
    "then), per component that pushes (dispatcher, compensator, replay)",
    ["subscription", "component"], multiprocess_mode="livemax")
BACKLOG = Gauge(
    "msgbus_subscription_backlog",
    "Deliveries not yet done (pending, failed, retrying) per subscription, from the bus's "
    "records; capped at 10,000", ["subscription"], multiprocess_mode="livemax")
OLDEST_UNDELIVERED_AGE = Gauge(
    "msgbus_subscription_oldest_undelivered_age_seconds",
    "Age of the oldest message not yet delivered to the subscription (0: none)",
    ["subscription"], multiprocess_mode="livemax")
PUSH_LATENCY = Histogram(
    "msgbus_push_latency_seconds", "Subscriber response time", ["subscription"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
BATCH_SIZE = Histogram(
    "msgbus_push_batch_messages", "Messages per batch push (batch subscriptions)",
    ["subscription"], buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000))
IN_FLIGHT = Gauge(
    "msgbus_pushes_in_flight", "Pushes in flight (semaphore occupancy)", ["subscription"],
    multiprocess_mode="livesum")

RETRIES = Counter(
    "msgbus_retries_total",
    "Compensator pushes of failed deliveries by outcome: delivered, failed (retried later), "
    "parked (given up), skipped (lease ran out before the push, or the message is missing)",
    ["subscription", "outcome"])
RETRIES_DUE = Gauge(
    "msgbus_retries_due", "Failed deliveries whose next attempt is due now (capped)",
    ["subscription"], multiprocess_mode="livemax")
RETRIES_WAITING = Gauge(
    "msgbus_retries_waiting", "Failed deliveries waiting for a retry, due or not (capped)",
    ["subscription"], multiprocess_mode="livemax")
OLDEST_RETRY_AGE = Gauge(
    "msgbus_oldest_retry_age_seconds",
    "Age of the oldest message whose delivery waits for a retry (0: none)",
    ["subscription"], multiprocess_mode="livemax")
SCHEDULED_WAITING = Gauge(
    "msgbus_scheduled_deliveries",
    "Deliveries waiting for their due time (deliver_at, delay_s; capped)",
    ["subscription"], multiprocess_mode="livemax")
PARKED = Gauge(
    "msgbus_parked_deliveries",
    "Deliveries given up by the retry policy (dead letters), waiting for a re-drive; alert "
    "when above 0", ["subscription"], multiprocess_mode="livemax")
SWEPT = Counter(
    "msgbus_swept_total",
    "Deliveries found pending for longer than the sweep threshold and handed to the retries",
    ["subscription"])
SWEEP_SECONDS = Histogram(
    "msgbus_sweep_seconds", "Time one sweep over every subscription took",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
REPLAY_PLANNED = Gauge(
    "msgbus_replay_planned", "Pushes a replay job planned (its dry-run count)", ["replay"],
    multiprocess_mode="livemax")
REPLAY_DONE = Gauge(
    "msgbus_replay_done", "Pushes a replay job has made so far", ["replay"],
    multiprocess_mode="livemax")

# -- the brokers' and MongoDB's own health (dispatcher/brokerhealth.py) ----------------------------
BROKER_UP = Gauge(
    "msgbus_broker_up", "1 when the broker cluster answered the last health poll, else 0",
    ["broker", "cluster"], multiprocess_mode="livemax")
MONGO_UP = Gauge(
    "msgbus_mongo_up", "1 when MongoDB answered the service's last ping, else 0", ["service"],
    multiprocess_mode="livemin")
RABBITMQ_NODE_RUNNING = Gauge(
    "msgbus_rabbitmq_node_running", "1 when the management API says the node runs",
    ["cluster", "node"], multiprocess_mode="livemax")
RABBITMQ_NODE_MEMORY_ALARM = Gauge(
    "msgbus_rabbitmq_node_memory_alarm",
    "1 while the node's memory alarm blocks publishers", ["cluster", "node"],
    multiprocess_mode="livemax")
RABBITMQ_NODE_DISK_ALARM = Gauge(
    "msgbus_rabbitmq_node_disk_alarm", "1 while the node's free-disk alarm blocks publishers",
    ["cluster", "node"], multiprocess_mode="livemax")
RABBITMQ_NODE_MEMORY_USED = Gauge(
    "msgbus_rabbitmq_node_memory_used_bytes", "Memory the node uses", ["cluster", "node"],
    multiprocess_mode="livemax")
RABBITMQ_FLOW_CONNECTIONS = Gauge(
    "msgbus_rabbitmq_flow_controlled_connections",
    "Connections in flow control or blocked (state flow, blocked or blocking)", ["cluster"],
    multiprocess_mode="livemax")
RABBITMQ_QUEUE_MESSAGES = Gauge(
    "msgbus_rabbitmq_queue_messages",
    "Messages in a subscription's RabbitMQ queue, ready or unacked (lags a few seconds)",
    ["cluster", "subscription", "state"], multiprocess_mode="livemax")
KAFKA_COMMITTED_OFFSET = Gauge(
    "msgbus_kafka_consumer_committed_offset",
    "Committed offset of a subscription's consumer group per partition",
    ["cluster", "subscription", "partition"], multiprocess_mode="livemax")
KAFKA_CONSUMER_LAG = Gauge(
    "msgbus_kafka_consumer_lag_messages",
    "End offset minus committed offset, summed over the partitions (an upper bound on brokers "
    "that advance the end per batch)", ["cluster", "subscription"], multiprocess_mode="livemax")
KAFKA_TOPIC_REPLICAS = Gauge(
    "msgbus_kafka_topic_replicas",
    "A destination topic's copies as the cluster describes them: replication_factor (fewest "
    "replicas of a partition), in_sync (fewest in-sync replicas), min_insync (its "
    "min.insync.replicas)", ["cluster", "destination", "what"], multiprocess_mode="livemin")
KAFKA_TOPIC_UNDER_REPLICATED = Gauge(
    "msgbus_kafka_topic_under_replicated",
    "1 when a destination's topic has fewer replicas or a lower min.insync.replicas than the "
    "settings ask, or a partition fewer in-sync replicas than min.insync.replicas",
    ["cluster", "destination"], multiprocess_mode="livemax")
RABBITMQ_QUEUE_COPIES_MISMATCH = Gauge(
    "msgbus_rabbitmq_queue_copies_mismatch",
    "1 when a subscription's queue is classic where quorum was asked for, is an ordered "
    "subscription's quorum queue without single active consumer, or has quorum members "
    "offline", ["cluster", "subscription"], multiprocess_mode="livemax")

# -- the node rescuer (`msgbus node-rescuer`, the DaemonSet) ---------------------------------------
NODE_QUEUES = Gauge(
    "msgbus_node_queues",
    "Local queues on the node by kind (receiver_buffer, client_spool) and state (held by a live "
    "process, idle: unheld but written recently, orphaned: to rescue)", ["kind", "state"])
NODE_ORPHAN_PENDING = Gauge(
    "msgbus_node_orphaned_messages",
    "Messages pending in the node's orphaned client spools at the last scan", ["kind"])
NODE_ORPHAN_OLDEST_AGE = Gauge(
    "msgbus_node_orphan_oldest_age_seconds",
    "Time since the longest-unwritten orphaned queue on the node was written (0: none)",
    ["kind"])
ORPHANS_RESCUED = Counter(
    "msgbus_orphans_rescued_total",
    "Orphaned queues the node rescuer handled, by kind and outcome (rescued and removed, "
    "left: some messages stay in it, failed)", ["kind", "outcome"])
RESCUER_LAST_SCAN = Gauge(
    "msgbus_node_rescuer_last_scan_timestamp_seconds",
    "When the node rescuer last finished a scan of its node's queues of a kind (Unix time); "
    "a receiver buffer waiting for MongoDB or a broker holds up its kind's next scan",
    ["kind"])


def render() -> tuple[bytes, str]:
    if os.environ.get(MULTIPROCESS_DIR_VARIABLE):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(), CONTENT_TYPE_LATEST


def forget_process(pid: int) -> None:
    """A process of a multiprocess service exited: drop its live gauges (its counters stay)."""
    if os.environ.get(MULTIPROCESS_DIR_VARIABLE):
        multiprocess.mark_process_dead(pid)
