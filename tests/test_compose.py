"""The compose deployment, checked by parsing it (Docker cannot run here)."""

from __future__ import annotations

import os
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
        for line in (COMPOSE / "tandem.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert env["TANDEM_REDIS_URL"] == "redis://redis:6379/0"
    for name in TANDEM_SERVICES:
        assert compose["services"][name]["env_file"] == "tandem.env"
        assert compose["services"][name]["build"]["dockerfile"] == "compose/Dockerfile"
    assert (COMPOSE / "Dockerfile").exists()


def test_the_producer_waits_for_a_worker_whose_executors_are_registered(compose):
    worker = compose["services"]["worker-0"]
    ready_file = worker["command"][worker["command"].index("--ready-file") + 1]
    assert worker["healthcheck"]["test"] == ["CMD", "tandem", "ready", "--file", ready_file]
    assert compose["services"]["producer"]["depends_on"] == {
        "worker-0": {"condition": "service_healthy"}
    }


def test_flower_takes_its_broker_from_the_env_file_and_redis_stays_local(compose):
    command = compose["services"]["flower"]["command"]
    assert command[:3] == ["celery", "-A", "tandem.broker.celeryapp"]
    assert not any("redis://" in part for part in command)
    # No password in this file: Redis is published to this host only.
    assert compose["services"]["redis"]["ports"] == ["127.0.0.1:6379:6379"]


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
    assert "0.0.0.0" in gateway["command"] and gateway["ports"] == ["8000:8000"]
    assert "/v2/health/ready" in " ".join(gateway["healthcheck"]["test"])


def test_the_image_installs_the_extra_of_every_service_it_runs():
    """The base install is the producer side: workers, Flower and the gateway each need
    their extra in the one image."""
    line = next(x for x in (COMPOSE / "Dockerfile").read_text().splitlines() if "pip install" in x)
    extras = set(line.split("[", 1)[1].split("]", 1)[0].split(","))
    assert {"worker", "flower", "http", "embed"} <= extras


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
    """README, "Your own models": the lines to add to x-worker mount a repository and
    point TANDEM_REPOSITORY at it, with settings tandem has."""
    import dataclasses
    import re
    import textwrap

    from tandem.broker.settings import Settings

    readme = (COMPOSE.parent / "README.md").read_text()
    section = readme.split("**Your own models.**", 1)[1].split("**One worker per GPU", 1)[0]
    (snippet,) = re.findall(r"```yaml\n(.*?)```", section, flags=re.S)
    extra = yaml.safe_load(textwrap.dedent(snippet))
    worker = {**compose["services"]["worker-0"], **extra}
    (mount,) = worker["volumes"]
    assert mount.split(":")[1] == worker["environment"]["TANDEM_REPOSITORY"]
    names = {f"TANDEM_{f.name.upper()}" for f in dataclasses.fields(Settings)}
    assert set(worker["environment"]) <= names
