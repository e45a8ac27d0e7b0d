"""The Celery app factory: one app per process, built from Settings."""

from __future__ import annotations

from celery import Celery

from tandem.broker import keys, payload
from tandem.broker.connect import celery_options
from tandem.broker.errors import TandemError
from tandem.broker.message import TASK_NAME
from tandem.broker.settings import Settings

#: The queue the worker's ordinary Celery consumer listens on. It never holds
#: inference tasks; those live in L1 and L2, which only executors read.
CONTROL_QUEUE = "tandem.ctl"
#: Where a task other than tandem.infer goes when nothing names its queue (a chain's next
#: step published by an executor, say): Celery's own default, where ordinary workers read.
DEFAULT_QUEUE = "celery"


def route_infer(name, args, kwargs, options, task=None, **kw):
    """A Celery task_routes entry: tandem.infer goes to the L1 queue of the model it
    names, tandem.l1.NAME.VERSION, so no signature needs `queue=`."""
    if name != TASK_NAME:
        return None
    model = (kwargs or {}).get("model") or (args[0] if args else None)
    try:
        return {"queue": keys.l1(model)}
    except (ValueError, TypeError, AttributeError):
        return None  # not NAME:VERSION: left to fail where it lands, with its own FAILURE


def worker_argv(*, queue: str, hostname: str, loglevel: str, events: bool) -> list[str]:
    """argv for Celery's worker_main: one solo-pool consumer of `queue`, no mingle or
    gossip (tandem workers and the bench's Celery workers alike)."""
    argv = [
        "worker",
        "--pool=solo",
        f"--queues={queue}",
        f"--loglevel={loglevel}",
        "--without-mingle",
        "--without-gossip",
    ]
    if events:
        argv.append("--task-events")
    if hostname:
        argv.append(f"--hostname={hostname}")
    return argv


def make_app(settings: Settings) -> Celery:
    """A Celery app on settings.redis_url, as broker and result backend, JSON only."""
    payload.register()
    app = Celery(
        "tandem", broker=settings.redis_url, backend=settings.redis_url, set_as_current=False
    )
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json", payload.CONTENT_TYPE],
        result_accept_content=["json"],
        task_default_queue=DEFAULT_QUEUE,
        task_routes=(route_infer,),
        result_expires=settings.result_expires_s,
        result_extended=settings.result_extended,
        task_send_sent_event=settings.send_sent_event,
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        redis_backend_health_check_interval=10,
        **celery_options(settings.redis_url, settings.sentinel_master),
    )
    app.tandem_settings = settings

    @app.task(name=TASK_NAME)
    def infer(model: str, inputs: object) -> None:
        raise TandemError(
            f"{TASK_NAME} ran in Celery's ordinary pool: publish it to the queue "
            "tandem.l1.NAME.VERSION, where tandem executors read it"
        )

    return app
