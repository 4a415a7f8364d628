"""deploy/monitoring: the alert rules and the Grafana dashboard name only metrics that msgbus
(or msgbus_client, in producer apps) exports, every alert says what it is about, and the rules
pass promtool's check and its unit tests (alerts_test.yml) on synthetic series."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from msgbus_client.metrics import ClientMetrics, PrometheusCollector
from msgbus_devtools.testkit.promtool import PromtoolUnavailable, promtool
from prometheus_client import REGISTRY, CollectorRegistry

import msgbus.metrics  # noqa: F401  (registers every metric)

MONITORING = Path(__file__).parents[2] / "deploy" / "monitoring"
RULES = MONITORING / "alerts.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
METRIC = re.compile(r"\bmsgbus_[a-z_]+")


class _StubClient:
    def metrics(self) -> ClientMetrics:
        return ClientMetrics(spool_dir="/spool", pending=0, rejected=0, used_bytes=0,
                             max_bytes=1, oldest_age_s=None, backing_off=False)


def _names(registry: Any) -> set[str]:
    names = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        names.update(f"{family.name}{suffix}" for suffix in ("_total", "_bucket", "_sum",
                                                              "_count"))
    return names


def exported_names() -> set[str]:
    client = CollectorRegistry()
    client.register(PrometheusCollector(_StubClient()))
    return _names(REGISTRY) | _names(client)


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"]
            for rule in group["rules"]]


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target and query variable of the dashboard."""
    board = json.loads(DASHBOARD.read_text())
    found = [(panel["title"], target["expr"]) for panel in board["panels"]
             for target in panel.get("targets", [])]
    found += [(f"variable {v['name']}", v["definition"])
              for v in board["templating"]["list"] if v["type"] == "query"]
    return found


def test_every_alert_names_an_exported_metric_and_has_a_summary() -> None:
    rules = alert_rules()
    assert len(rules) >= 15
    exported = exported_names()
    for rule in rules:
        used = set(METRIC.findall(rule["expr"]))
        assert used and used <= exported, f"{rule['alert']}: unknown {used - exported}"
        assert rule["annotations"]["summary"], rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]


def test_alerts_cover_what_operators_must_hear_about() -> None:
    watched = set().union(*(METRIC.findall(rule["expr"]) for rule in alert_rules()))
    for metric in ("msgbus_subscription_oldest_undelivered_age_seconds",  # the primary signal
                   "msgbus_pushes_total",  # failure rate, dispatcher stalls
                   "msgbus_parked_deliveries",
                   "msgbus_local_buffer_oldest_age_seconds", "msgbus_local_buffer_bytes",
                   "msgbus_client_spool_oldest_message_age_seconds",
                   "msgbus_node_orphan_oldest_age_seconds", "msgbus_orphans_rescued_total",
                   "msgbus_broker_up", "msgbus_mongo_available",
                   "msgbus_rabbitmq_node_memory_alarm",
                   "msgbus_rabbitmq_flow_controlled_connections",
                   "msgbus_kafka_topic_under_replicated",
                   "msgbus_rabbitmq_queue_copies_mismatch"):
        assert metric in watched, f"no alert watches {metric}"


def test_every_dashboard_query_names_an_exported_metric() -> None:
    queries = dashboard_queries()
    assert len(queries) >= 20
    exported = exported_names()
    for title, expr in queries:
        used = set(METRIC.findall(expr))
        assert used and used <= exported, f"{title}: unknown {used - exported}"
    board = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


@pytest.fixture(scope="module")
def promtool_path() -> Path:
    try:
        return promtool()
    except PromtoolUnavailable as exc:
        pytest.fail(f"promtool is unavailable: {exc}", pytrace=False)


@pytest.mark.parametrize("command", [["check", "rules", "alerts.yml"],
                                     ["test", "rules", "alerts_test.yml"]])
def test_deploy_alert_rules_pass_promtool(promtool_path: Path, command: list[str]) -> None:
    done = subprocess.run([str(promtool_path), *command], cwd=MONITORING, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
