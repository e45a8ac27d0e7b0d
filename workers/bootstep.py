"""A worker bootstep that runs tandem executors inside a normal Celery worker process."""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

import redis
from celery import bootsteps

from tandem.broker import tracing
from tandem.broker.connect import connect
from tandem.broker.faults import Faults
from tandem.broker.settings import Settings
from tandem.broker.table import Table
from tandem.workers.canvas import Canvas
from tandem.workers.executor import Executor
from tandem.workers.heartbeat import Heartbeat
from tandem.workers.hooks import CeleryEvents, Hook, Logs, Metrics
from tandem.workers.models import Model, load_model
from tandem.workers.models.loading import pick_device

log = logging.getLogger("tandem.worker")

#: Exit code of a worker that gave up on a hung compute or on an executor that keeps
#: crashing (EX_SOFTWARE), so that compose, systemd or Kubernetes restart it.
EXIT_UNHEALTHY = 70
#: Redis connections one executor may hold at once.
CONNECTIONS_PER_EXECUTOR = 3


class Executors(bootsteps.StartStopStep):
    """Starts one executor per loaded model, heartbeats them, and stops them gracefully."""

    label = "tandem executors"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.executors: list[Executor] = []
        self.heartbeat: Heartbeat | None = None

    def start(self, worker: Any) -> None:
        settings: Settings = worker.app.tandem_settings
        self.app = worker.app
        worker.app.tandem_controller = worker  # run_worker exits with its exit code
        worker.app.tandem_executors = self  # for remote control (workers/control.py)
        served = [
            (ref, model)
            for ref, model in worker.app.tandem_models.items()
            for _ in range(settings.executors_per_model)
        ]
        # Each executor may hold three connections at once (its blocking wait, its
        # returner's store, its window's subscription); redis-py's default pool has 100.
        client = connect(
            settings.redis_url,
            settings.sentinel_master,
            health_check_interval=10,
            max_connections=CONNECTIONS_PER_EXECUTOR * len(served) + 16,
        )
        table = Table(client, settings, faults=Faults.from_env())
        hooks: list[Hook] = [Logs(), Metrics(), CeleryEvents(worker.app, worker.hostname)]
        tracer = tracing.tracer("tandem-worker")
        if tracer is not None:
            from tandem.workers.tracing import Traces, records_nothing, usable

            if not usable(tracer):
                log.warning("the tracer is not OpenTelemetry's SDK: batches are not traced")
            elif not records_nothing(tracer):
                hooks.append(Traces(tracer, worker.hostname))
        canvas = Canvas(worker.app, worker.hostname)
        for ref, model in served:
            executor = Executor(
                ref,
                model,
                table=table,
                settings=settings,
                worker=worker.hostname,
                hooks=hooks,
                on_give_up=self._give_up,
                canvas=canvas,
            )
            executor.start()
            self.executors.append(executor)
            log.info(
                "executor %s serving %s (max batch %d, window %g ms)",
                executor.id,
                ref,
                executor.max_batch,
                executor.max_wait_ms,
            )
        self.heartbeat = Heartbeat(
            table,
            self.executors,
            interval_s=settings.heartbeat_s,
            ttl_s=settings.heartbeat_ttl_s,
            on_hung=self._hung,
            ready_file=settings.ready_file,
        ).start()

    def _give_up(self, executor: Executor) -> None:
        """An executor keeps crashing: stop the worker gracefully, exiting non-zero."""
        self.app.tandem_exitcode = EXIT_UNHEALTHY
        os.kill(os.getpid(), signal.SIGTERM)  # Celery's warm shutdown, which stops the rest

    def _hung(self, executor: Executor) -> None:
        """A compute ran past compute_timeout_s. It cannot be interrupted in-process: hand
        every executor's tasks back (the hung batch's with a delivery each) and exit now."""
        log.critical(
            "executor %s: a batch has computed for over %gs (compute_timeout_s); the worker "
            "exits with code %d so that its supervisor restarts it",
            executor.id,
            executor.settings.compute_timeout_s,
            EXIT_UNHEALTHY,
        )
        for other in self.executors:
            try:
                other.table.reclaim(other.id, other.model_ref, force=True, count=other is executor)
            except redis.RedisError as e:
                log.error("could not hand back %s's tasks (%s); the coordinator will", other.id, e)
        logging.shutdown()
        os._exit(EXIT_UNHEALTHY)

    def stop(self, worker: Any) -> None:
        for executor in self.executors:  # all at once: none takes new work meanwhile
            executor.request_stop()
        for executor in self.executors:
            executor.stop()
        if self.heartbeat:
            self.heartbeat.stop()

    def terminate(self, worker: Any) -> None:
        """Celery's cold shutdown (a second Ctrl-C, SIGQUIT): every executor hands back
        what it holds at once, without waiting for the batch computing."""
        if self.heartbeat:
            self.heartbeat.stop()
        for executor in self.executors:
            executor.request_stop()
        for executor in self.executors:
            executor.terminate()

    def info(self, worker: Any) -> dict[str, Any]:
        """Feeds `celery inspect stats`, and so Flower's "Other statistics"."""
        rows = [executor.info() for executor in self.executors]
        try:
            depths = (
                {e.id: e.l2_depth for e in self.executors[0].table.executors()}
                if self.executors
                else {}
            )
        except redis.RedisError:
            depths = {}
        for row in rows:
            row["l2_depth"] = depths.get(row["id"])
        return {"tandem": rows}


def load_models(settings: Settings) -> dict[str, Model]:
    """Load every model before the worker starts, so a bad one stops it with a clear error.
    A device this process cannot see stops it first, whatever the models."""
    pick_device(settings.device)
    models: dict[str, Model] = {}
    for requested in settings.models:
        log.info("loading %s", requested)
        ref, model = load_model(requested, settings)
        models[ref] = model
        log.info("loaded %s as %s: %r", requested, ref, model)
    return models


def _stopped_loading(signum, frame) -> None:
    log.info("stopped while loading its models: it held no task")
    raise SystemExit(0)


def prepare() -> None:
    """Import what run_worker and Celery's worker need, ahead of it: a standby worker
    (`tandem worker --standby`) then starts serving in the time its models take to load."""
    import celery.apps.worker  # noqa: F401
    import celery.bin.celery  # noqa: F401
    import kombu.transport.redis  # noqa: F401

    import tandem.workers.control  # noqa: F401


def run_worker(settings: Settings) -> None:
    """Run a Celery worker hosting one executor per model, until SIGTERM or SIGINT."""
    import tandem.workers.control  # noqa: F401 - registers tandem's remote control commands
    from tandem.broker.app import CONTROL_QUEUE, make_app, worker_argv

    # Stopped while it loads its models (a scale-in that changed its mind): it holds no
    # task yet, so it exits at once, and cleanly. Celery installs its own handlers after.
    signal.signal(signal.SIGTERM, _stopped_loading)
    tracing.tracer("tandem-worker")  # set up first: a misconfigured exporter stops it here
    models = load_models(settings)
    app = make_app(settings)
    app.tandem_models = models
    app.steps["worker"].add(Executors)
    hostname = settings.hostname or default_node_name(settings.models)
    app.worker_main(
        worker_argv(queue=CONTROL_QUEUE, hostname=hostname, loglevel=settings.loglevel, events=True)
    )
    # worker_main() drops the worker's exit code (Celery's "Unrecoverable error" sets 1), so
    # a supervisor would see 0 and not restart it: exit with the controller's own code.
    controller = getattr(app, "tandem_controller", None)
    sys.exit(getattr(app, "tandem_exitcode", 0) or getattr(controller, "exitcode", 0) or 0)


def default_node_name(models: tuple[str, ...]) -> str:
    """A node name unique on its host and readable in Flower: ``sim.1-4242@<host>``.

    Celery's own default, ``celery@<host>``, is the same for every worker on a host, so
    Flower would merge them into one and Celery warns about duplicate nodes.
    """
    served = "+".join(m.replace(":", ".") for m in models) or "tandem"
    return f"{served}-{os.getpid()}@%h"
