"""A worker bootstep that runs tandem executors inside a normal Celery worker process."""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis
from celery import bootsteps

from broker.table import Table
from workers.executor import Executor
from workers.models import load_builtin

log = logging.getLogger("tandem.worker")


class Executors(bootsteps.StartStopStep):
    """Starts one executor per --model, heartbeats them, and stops them gracefully."""

    label = "tandem executors"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.executors: list[Executor] = []
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def start(self, worker: Any) -> None:
        settings = worker.app.tandem_settings
        client = redis.Redis.from_url(settings.redis_url, health_check_interval=10)
        table = Table(client)
        for ref in settings.models:
            model = load_builtin(ref, settings)
            executor = Executor(ref, model, table=table, settings=settings, worker=worker.hostname)
            executor.start()
            self.executors.append(executor)
            log.info("executor %s serving %s", executor.id, ref)
        self._heartbeat = threading.Thread(
            target=self._beat, args=(table, settings), name="tandem heartbeat", daemon=True
        )
        self._heartbeat.start()

    def stop(self, worker: Any) -> None:
        for executor in self.executors:
            executor.stop()
        self._stop.set()

    def info(self, worker: Any) -> dict[str, Any]:
        return {"tandem": [executor.info() for executor in self.executors]}

    def _beat(self, table: Table, settings: Any) -> None:
        ttl_ms = int(settings.heartbeat_ttl_s * 1000)
        while not self._stop.wait(settings.heartbeat_s):
            live = [e.id for e in self.executors if e.alive]
            try:
                table.heartbeat(live, ttl_ms)
            except (redis.ConnectionError, redis.TimeoutError) as e:
                log.warning("heartbeat failed: %s", e)


def run_worker(settings: Any) -> None:
    """Run a Celery worker hosting one executor per model, until SIGTERM or SIGINT."""
    from broker.errors import UnknownModel
    from broker.keys import parse_model
    from workers.app import CONTROL_QUEUE, make_app
    from workers.models import BUILTIN

    for ref in settings.models:
        name, _ = parse_model(ref)
        if name not in BUILTIN:
            raise UnknownModel(
                f"no built-in model {name!r}; built-in models are {', '.join(BUILTIN)}"
            )
    app = make_app(settings)
    app.steps["worker"].add(Executors)
    argv = [
        "worker",
        "--pool=solo",
        f"--queues={CONTROL_QUEUE}",
        f"--loglevel={settings.loglevel}",
        "--without-mingle",
        "--without-gossip",
    ]
    if settings.hostname:
        argv.append(f"--hostname={settings.hostname}")
    app.worker_main(argv)
