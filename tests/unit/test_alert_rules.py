"""The shipped Prometheus alert rules name only metrics msgbus exports, and say what to do."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from prometheus_client import REGISTRY

import msgbus.metrics  # noqa: F401  (registers every metric)

RULES = Path(__file__).parents[2] / "deploy" / "prometheus" / "alerts.yml"


def _exported_names() -> set[str]:
    names = set()
    for family in REGISTRY.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        names.update(f"{family.name}{suffix}" for suffix in ("_total", "_bucket", "_sum",
                                                              "_count"))
    return names


def test_every_alert_names_an_exported_metric_and_has_a_summary() -> None:
    rules = [rule for group in yaml.safe_load(RULES.read_text())["groups"]
             for rule in group["rules"]]
    assert rules
    exported = _exported_names()
    for rule in rules:
        used = set(re.findall(r"\bmsgbus_[a-z_]+", rule["expr"]))
        assert used and used <= exported, f"{rule['alert']}: unknown {used - exported}"
        assert rule["annotations"]["summary"], rule["alert"]
