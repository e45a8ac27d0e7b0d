"""The two usual ways of running inference on Celery, for `tandem bench` to compare against.

- plain: one Celery task per request, acks_late, prefetch multiplier 1.
- batches: the celery-batches package, flush_every and flush_interval.

Both compute with the same model code as tandem's executors and store results in
Celery's Redis backend. Run a worker (settings from TANDEM_* variables):

    python -m tandem.tools.baselines plain
    python -m tandem.tools.baselines batches --flush-every 32 --flush-interval-ms 10
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery

from tandem.broker.app import worker_argv
from tandem.broker.settings import Settings, load_settings

PLAIN_TASK, PLAIN_QUEUE = "bench.plain", "bench.plain"
BATCHES_TASK, BATCHES_QUEUE = "bench.batches", "bench.batches"
#: Redis counters of the batches baseline: tasks and batches computed.
TASKS, BATCHES = "bench:tasks", "bench:batches"


def task_of(kind: str) -> tuple[str, str]:
    """The task name and queue of a baseline kind (plain or batches)."""
    return (PLAIN_TASK, PLAIN_QUEUE) if kind == "plain" else (BATCHES_TASK, BATCHES_QUEUE)


def producer(url: str) -> Celery:
    """A Celery app that sends the baselines' tasks, as their callers would."""
    app = Celery("bench-producer", broker=url, backend=url)
    app.conf.update(task_serializer="json", accept_content=["json"])
    return app


def make_compute(settings: Settings) -> Callable[[list[Any]], list[Any]]:
    """The batch computation of the first configured model, as tandem's executor runs it."""
    from tandem.workers.models import load_model

    _ref, model = load_model(settings.models[0], settings)

    def compute(batch: list[Any]) -> list[Any]:
        return model.run([model.validate(inputs) for inputs in batch])

    return compute


def _app(name: str, settings: Settings, queue: str) -> Celery:
    app = Celery(name, broker=settings.redis_url, backend=settings.redis_url)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_default_queue=queue,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    return app


def plain_app(settings: Settings) -> Celery:
    app = _app("bench-plain", settings, PLAIN_QUEUE)
    app.conf.update(task_acks_late=True, worker_prefetch_multiplier=1)
    compute = make_compute(settings)

    @app.task(name=PLAIN_TASK)
    def infer(inputs: Any) -> Any:
        return compute([inputs])[0]

    return app


def batches_app(settings: Settings, flush_every: int, flush_interval_ms: float) -> Celery:
    from celery_batches import Batches

    app = _app("bench-batches", settings, BATCHES_QUEUE)
    app.conf.update(worker_prefetch_multiplier=2 * flush_every)
    compute = make_compute(settings)
    counters = redis.Redis.from_url(settings.redis_url)

    @app.task(
        name=BATCHES_TASK,
        base=Batches,
        flush_every=flush_every,
        flush_interval=flush_interval_ms / 1000,
        ignore_result=True,
    )
    def infer(requests: list) -> None:
        outputs = compute([request.kwargs["inputs"] for request in requests])
        with counters.pipeline() as pipe:
            pipe.incrby(TASKS, len(requests))
            pipe.incr(BATCHES)
            pipe.execute()
        for request, output in zip(requests, outputs, strict=True):
            app.backend.mark_as_done(request.id, output, request=request)

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["plain", "batches"])
    parser.add_argument("--flush-every", type=int, default=32)
    parser.add_argument("--flush-interval-ms", type=float, default=10.0)
    parser.add_argument("--hostname", default="")
    args = parser.parse_args(argv)
    settings = load_settings()
    if args.kind == "plain":
        app, queue = plain_app(settings), PLAIN_QUEUE
    else:
        app, queue = batches_app(settings, args.flush_every, args.flush_interval_ms), BATCHES_QUEUE
    app.worker_main(
        worker_argv(queue=queue, hostname=args.hostname, loglevel="WARNING", events=False)
    )


if __name__ == "__main__":
    main()
