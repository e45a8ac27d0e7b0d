"""Test session: a real redis-server on a free port, real worker and coordinator processes."""

from __future__ import annotations

import contextlib
import gc
import signal
import subprocess
from pathlib import Path

import pytest
import redis

from helpers import PLAIN_APPS, fast_settings, wait_until
from tandem.broker.settings import Settings
from tandem.broker.table import Table
from tandem.producers.client import stop_result_listener
from tandem.server import RedisServer, free_port
from tandem.stack import spawn, stop_process


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    for app in PLAIN_APPS:
        stop_result_listener(app)
    # Results unsubscribe when collected; collect them while Redis still answers.
    gc.collect()
    server.stop()


@pytest.fixture
def r(redis_server):
    """A client on a freshly emptied database."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def settings(redis_server) -> Settings:
    """Settings for the test Redis, with short heartbeats so dead executors expire fast."""
    return fast_settings(redis_server.url)


#: The slow worker's compute per batch, in the gateway test stack.
SLOW_MS = 300


@contextlib.contextmanager
def gateway_stack(folder: Path):
    """The stack the gateway's tests share: a fast worker (sim:1 at zero cost, tiny:1), a
    slow one (sim:2, SLOW_MS a batch, L1 bounded at 1 task), a coordinator, and a gateway
    named "gateway" (`.url`; its gRPC address in `.grpc["gateway"]`)."""
    server = RedisServer(folder / "redis").start()
    settings = fast_settings(server.url)
    client = redis.Redis.from_url(server.url)
    procs = Processes(settings, client, folder / "logs")
    try:
        procs.worker("fast", models=("sim:1", "tiny:1"), sim_base_ms=0, sim_per_item_ms=0)
        procs.worker("slow", models=("sim:2",), sim_base_ms=SLOW_MS, sim_per_item_ms=0, max_queue=1)
        procs.coordinator()
        procs.url = procs.gateway("gateway")
        yield procs
    finally:
        procs.stop_all()
        client.close()
        server.stop()


class Processes:
    """Starts `tandem worker` and `tandem coordinator` processes; stops them all at teardown."""

    def __init__(self, settings: Settings, client: redis.Redis, logs: Path) -> None:
        self.settings = settings
        self.client = client
        self.logs = logs
        self.started: list[subprocess.Popen] = []
        self.grpc: dict[str, str] = {}  # gateway name -> its gRPC address
        self.url = ""  # the gateway's, where a test stack has one

    def worker(
        self, name: str = "w1", idle: bool = True, env: dict | None = None, **overrides
    ) -> subprocess.Popen:
        """Start a worker; wait until its executors are registered (and IDLE if `idle`).
        env: more variables for it."""
        settings = self.settings.replace(hostname=f"{name}@test", **overrides)
        process = spawn(["worker"], settings, self.logs / f"{name}.log", env=env)
        self.started.append(process)
        table = Table(self.client)

        def ready() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"worker {name} exited:\n{self.log(name)}")
            mine = [e for e in table.executors() if e.worker == settings.hostname]
            expected = len(settings.models) * settings.executors_per_model
            return len(mine) == expected and (not idle or all(e.state == "IDLE" for e in mine))

        wait_until(ready, 60, f"worker {name} to come up")
        return process

    def coordinator(self, metrics_port: int = 0, env: dict | None = None) -> subprocess.Popen:
        args = (
            ["coordinator", f"--metrics-port={metrics_port}"] if metrics_port else ["coordinator"]
        )
        process = spawn(args, self.settings, self.logs / "coordinator.log", env=env)
        self.started.append(process)
        return process

    def gateway(self, name: str = "http", *flags: str, env: dict | None = None) -> str:
        """Start `tandem http` on free ports (HTTP, and gRPC unless a flag sets its port);
        wait until it is ready. Returns its URL; `grpc[name]` is its gRPC address."""
        import httpx

        port = free_port()
        if not any(flag.startswith("--grpc-port") for flag in flags):
            flags = (f"--grpc-port={free_port()}", *flags)
        grpc_port = next(int(f.split("=")[1]) for f in flags if f.startswith("--grpc-port"))
        self.grpc[name] = f"127.0.0.1:{grpc_port}"
        log = self.logs / f"{name}.log"
        process = spawn(["http", f"--port={port}", *flags], self.settings, log, env=env)
        self.started.append(process)
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"gateway {name} exited:\n{self.log(name)}")
            try:
                return httpx.get(url + "/v2/health/ready", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, 60, f"gateway {name} to come up")
        return url

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text()

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
        for process in self.started:
            stop_process(process)


@pytest.fixture
def processes(settings, r, tmp_path):
    procs = Processes(settings, r, tmp_path / "logs")
    yield procs
    procs.stop_all()
    gc.collect()
