"""A local stack for `tandem up`, `tandem demo` and tests: Redis, a coordinator, N workers.

Each part runs as its own process, started exactly as an operator would start it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

from broker.server import RedisServer
from broker.settings import Settings
from broker.table import Table


def settings_env(settings: Settings) -> dict[str, str]:
    """Settings as TANDEM_* variables, for a child process."""
    env = {}
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if isinstance(value, tuple):
            value = ",".join(value)
        env[f"TANDEM_{field.name.upper()}"] = str(value)
    return env


def spawn(
    args: list[str], settings: Settings, log_path: Path, module: str = "broker.cli"
) -> subprocess.Popen:
    """Start `python -m MODULE ARGS` (by default `tandem ARGS`), its output going to log_path."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **settings_env(settings)}
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_process(process: subprocess.Popen, timeout_s: float = 30.0) -> int:
    """SIGTERM, wait, then SIGKILL if it will not stop. Returns the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def wait_for_executors(
    client: redis.Redis, count: int, timeout_s: float = 60.0, processes: list[subprocess.Popen] = ()
) -> None:
    """Block until `count` executors are registered and IDLE."""
    table = Table(client)
    deadline = time.monotonic() + timeout_s
    while True:
        ready = [e for e in table.executors() if e.state == "IDLE"]
        if len(ready) >= count:
            return
        dead = [p.args for p in processes if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(f"{len(ready)} of {count} executors came up; exited: {dead}")
        time.sleep(0.05)  # polling a condition, bounded by the deadline


class Stack:
    """Redis (embedded unless settings name one), a coordinator and `workers` workers."""

    def __init__(
        self,
        settings: Settings,
        *,
        workers: int = 2,
        embedded: bool = True,
        data_dir: str | Path = ".tandem",
    ) -> None:
        self.settings = settings
        self.workers = workers
        self.embedded = embedded
        self.data_dir = Path(data_dir)
        self.server: RedisServer | None = None
        self.processes: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return self.settings.redis_url

    def start(self, timeout_s: float = 60.0) -> Stack:
        if self.embedded:
            self.server = RedisServer(self.data_dir / "redis").start()
            self.settings = self.settings.replace(redis_url=self.server.url)
        logs = self.data_dir / "logs"
        self.processes.append(spawn(["coordinator"], self.settings, logs / "coordinator.log"))
        for n in range(self.workers):
            worker = self.settings.replace(hostname=f"worker{n + 1}@%h")
            self.processes.append(spawn(["worker"], worker, logs / f"worker{n + 1}.log"))
        client = redis.Redis.from_url(self.url)
        try:
            wait_for_executors(
                client, self.workers * len(self.settings.models), timeout_s, self.processes
            )
        except Exception:
            self.stop()
            raise
        finally:
            client.close()
        return self

    def stop(self) -> None:
        for process in reversed(self.processes):
            stop_process(process)
        self.processes.clear()
        if self.server:
            self.server.stop()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
