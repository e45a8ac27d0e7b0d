"""The compose deployment, checked by parsing it and by docker compose's own `config`
(no Docker engine runs here, so nothing is started)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parent.parent
COMPOSE = ROOT / "compose"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())


WORKERS = [f"worker-{n}" for n in range(4)]
TANDEM_SERVICES = ["coordinator", *WORKERS, "flower", "gateway", "producer"]


def test_services_are_all_there(compose):
    others = {"redis", "coordinator", "flower", "gateway", "producer", "prometheus", "grafana"}
    others.add("jaeger")
    assert set(compose["services"]) == others | set(WORKERS)


def test_redis_keeps_data_and_never_evicts(compose):
    command = " ".join(compose["services"]["redis"]["command"])
    assert "--appendonly yes" in command
    assert "--maxmemory-policy noeviction" in command
    assert compose["services"]["redis"]["volumes"] == ["redis-data:/data"]


def test_each_worker_reserves_its_own_gpu(compose):
    ids = []
    for name in WORKERS:
        worker = compose["services"][name]
        (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        assert "count" not in device  # count: 1 on every replica would share one GPU
        (gpu,) = device["device_ids"]
        ids.append(gpu)
        # Its one GPU is cuda:0 inside the container; it keeps a ready file fresh.
        assert worker["command"][:4] == ["tandem", "worker", "--device", "cuda:0"]
        assert worker["stop_signal"] == "SIGTERM" and worker["stop_grace_period"] == "90s"
    assert sorted(ids) == [str(n) for n in range(len(WORKERS))]  # distinct, 0..N-1


def test_every_tandem_service_shares_the_env_file(compose):
    env = dict(
        line.split("=", 1)
        for line in (COMPOSE / "k8s" / "tandem.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert env["TANDEM_REDIS_URL"] == "redis://redis:6379/0"
    for name in TANDEM_SERVICES:  # the same file as the Kubernetes ConfigMap's
        assert compose["services"][name]["env_file"] == ["k8s/tandem.env", "tracing/tracing.env"]
        assert compose["services"][name]["build"]["dockerfile"] == "compose/Dockerfile"
    assert (COMPOSE / "Dockerfile").exists()


def test_the_producer_waits_for_a_worker_whose_executors_are_registered(compose):
    worker = compose["services"]["worker-0"]
    ready_file = worker["command"][worker["command"].index("--ready-file") + 1]
    assert worker["healthcheck"]["test"] == ["CMD", "tandem", "ready", "--file", ready_file]
    assert compose["services"]["producer"]["depends_on"] == {
        "worker-0": {"condition": "service_healthy"}
    }


def test_flower_takes_its_broker_from_the_env_file_and_asks_for_a_login_when_told(compose):
    flower = compose["services"]["flower"]
    assert flower["command"][:3] == ["celery", "-A", "tandem.broker.celeryapp"]
    assert not any("redis://" in part for part in flower["command"])
    # Passed on from the shell only when set there: an empty one would lock Flower.
    assert flower["environment"] == ["FLOWER_BASIC_AUTH"]


PUBLISHED = {
    "flower": (5555,),
    "gateway": (8000, 8001),
    "prometheus": (9090,),
    "grafana": (3000,),
    "jaeger": (16686,),
}


def test_only_what_a_user_opens_is_published_and_on_this_host_by_default(compose):
    for name, service in compose["services"].items():
        if name in PUBLISHED:
            ports = PUBLISHED[name]
            assert service["ports"] == [f"${{PUBLISH_ADDRESS:-127.0.0.1}}:{p}:{p}" for p in ports]
        elif name == "redis":  # no password here: this host only, whatever PUBLISH_ADDRESS
            assert service["ports"] == ["127.0.0.1:6379:6379"]
        else:
            assert "ports" not in service, f"{name} publishes a port"


def compose_config(env: dict[str, str]) -> dict:
    """`docker compose config` (v2), else Debian's `docker-compose config` (v1): the file
    as Compose resolves it, variables and anchors included. Needs no Docker engine."""
    if (
        shutil.which("docker")
        and not subprocess.run(["docker", "compose", "version"], capture_output=True).returncode
    ):
        argv = ["docker", "compose"]
    elif shutil.which("docker-compose"):
        argv = ["docker-compose"]
    else:
        pytest.skip(
            "no docker compose: v2 is not packaged for this OS, and Debian's docker-compose "
            "(v1) is not installed (.ci/run installs it)"
        )
    done = subprocess.run(
        [*argv, "-f", str(COMPOSE / "docker-compose.yml"), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def published(service: dict) -> list[tuple[str, int]]:
    """(host address, port) of each published port, in v1's short or v2's long form."""
    out = []
    for port in service.get("ports", []):
        if isinstance(port, dict):
            out.append((port.get("host_ip", "0.0.0.0"), int(port["published"])))
        else:
            address, host_port, _ = port.split(":")
            out.append((address, int(host_port)))
    return out


def test_docker_compose_accepts_the_file_and_publishes_on_this_host():
    resolved = compose_config({})
    services = resolved["services"]
    assert set(services) == set(compose_services())
    # Compose read the env file into each service's environment.
    assert services["gateway"]["environment"]["TANDEM_REDIS_URL"] == "redis://redis:6379/0"
    for name, service in services.items():
        for address, _ in published(service):
            assert address == "127.0.0.1", f"{name} is published on {address}"
    opened = compose_config({"PUBLISH_ADDRESS": "0.0.0.0"})["services"]
    assert published(opened["gateway"]) == [("0.0.0.0", 8000), ("0.0.0.0", 8001)]
    assert published(opened["redis"]) == [("127.0.0.1", 6379)]


def compose_services() -> list[str]:
    return list(yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())["services"])


@pytest.mark.parametrize("service", ["coordinator", "worker-0", "flower", "gateway", "producer"])
def test_each_command_exists(compose, service):
    command = compose["services"][service]["command"]
    if command[0] == "tandem":
        argv = ["tandem", command[1], "--help"]
    else:
        argv = [sys.executable, "-m", *command[:3], "flower", "--help"]
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "FLOWER_UNAUTHENTICATED_API": "true"},
    )
    assert done.returncode == 0, done.stderr
    if command[0] != "tandem":
        return  # Flower's own options are Tornado's and not listed by --help
    for flag in [part.split("=")[0] for part in command[2:] if part.startswith("--")]:
        assert flag in done.stdout, f"{service}: {flag} is not an option"


def test_the_gateway_listens_on_every_address_and_is_checked_on_its_ready_path(compose):
    gateway = compose["services"]["gateway"]
    assert gateway["command"][:2] == ["tandem", "http"]
    assert "0.0.0.0" in gateway["command"]  # inside its container: published on 127.0.0.1
    assert gateway["environment"] == ["TANDEM_HTTP_TOKEN"]
    assert "/v2/health/ready" in " ".join(gateway["healthcheck"]["test"])


def test_the_image_installs_the_extra_of_every_service_it_runs():
    """The base install is the producer side: workers, Flower and the gateway each need
    their extra in the one image."""
    line = next(x for x in (COMPOSE / "Dockerfile").read_text().splitlines() if "pip install" in x)
    extras = set(line.split("[", 1)[1].split("]", 1)[0].split(","))
    assert {"worker", "flower", "http", "embed", "otel"} <= extras


def test_the_image_copies_every_folder_the_package_maps():
    """The Dockerfile installs from a copy of the tree: every folder pyproject.toml maps to
    a tandem subpackage must be in it, or the image's `pip install .` misses a layer."""
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = set(config["tool"]["setuptools"]["package-dir"].values())
    copied = {
        line.split()[1]
        for line in (COMPOSE / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ") and len(line.split()) == 3
    }
    assert folders <= copied, f"the Dockerfile does not copy {sorted(folders - copied)}"


def test_the_readme_snippet_for_your_own_models_fits_a_worker(compose):
    """docs/operating.md, "Your own models": the lines to add to x-worker mount a repository and
    point TANDEM_REPOSITORY at it, with settings tandem has."""
    import dataclasses
    import re
    import textwrap

    from tandem.broker.settings import Settings

    operating = (COMPOSE.parent / "docs" / "operating.md").read_text()
    section = operating.split("**Your own models.**", 1)[1].split("**One worker per GPU", 1)[0]
    (snippet,) = re.findall(r"```yaml\n(.*?)```", section, flags=re.S)
    extra = yaml.safe_load(textwrap.dedent(snippet))
    worker = {**compose["services"]["worker-0"], **extra}
    (mount,) = worker["volumes"]
    assert mount.split(":")[1] == worker["environment"]["TANDEM_REPOSITORY"]
    names = {f"TANDEM_{f.name.upper()}" for f in dataclasses.fields(Settings)}
    assert set(worker["environment"]) <= names


def test_every_tandem_service_traces_to_the_jaeger_service(compose):
    env = dict(
        line.split("=", 1)
        for line in (COMPOSE / "tracing" / "tracing.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4317"
    assert "jaeger" in compose["services"]
    # A sampler OpenTelemetry's SDK knows, which follows a caller's decision.
    assert env["OTEL_TRACES_SAMPLER"].startswith("parentbased_")
