"""A worker bootstep that runs tandem executors inside a normal Celery worker process."""

from __future__ import annotations

import logging
from typing import Any

import redis
from celery import bootsteps

from broker.table import Table
from workers.executor import Executor
from workers.heartbeat import Heartbeat
from workers.models import load_builtin

log = logging.getLogger("tandem.worker")


class Executors(bootsteps.StartStopStep):
    """Starts one executor per --model, heartbeats them, and stops them gracefully."""

    label = "tandem executors"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.executors: list[Executor] = []
        self.heartbeat: Heartbeat | None = None

    def start(self, worker: Any) -> None:
        settings = worker.app.tandem_settings
        table = Table(redis.Redis.from_url(settings.redis_url, health_check_interval=10))
        for ref in settings.models:
            executor = Executor(
                ref,
                load_builtin(ref, settings),
                table=table,
                settings=settings,
                worker=worker.hostname,
            )
            executor.start()
            self.executors.append(executor)
            log.info("executor %s serving %s", executor.id, ref)
        self.heartbeat = Heartbeat(
            table, self.executors, interval_s=settings.heartbeat_s, ttl_s=settings.heartbeat_ttl_s
        ).start()

    def stop(self, worker: Any) -> None:
        for executor in self.executors:
            executor.stop()
        if self.heartbeat:
            self.heartbeat.stop()

    def info(self, worker: Any) -> dict[str, Any]:
        return {"tandem": [executor.info() for executor in self.executors]}


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
