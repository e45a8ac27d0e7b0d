"""Waiting on conditions with deadlines, never on fixed sleeps."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import redis
from celery import Celery

from broker.table import ExecutorInfo, Table

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout_s: float = 30.0, what: str = "") -> T:
    """Poll `condition` until it returns something truthy; fail after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or condition}")
        time.sleep(0.01)  # polling interval of a condition wait, bounded by the deadline


def executors_of(r: redis.Redis, worker: str) -> list[ExecutorInfo]:
    """The executors of the test worker started under `worker`."""
    return [e for e in Table(r).executors() if e.worker == f"{worker}@test"]


#: Every plain Celery app the tests made, so the session can quiet them before Redis stops.
PLAIN_APPS: list[Celery] = []


def plain_celery(settings) -> Celery:
    """A Celery client that knows only the task name, the kwargs and the queue name."""
    app = Celery("plain", broker=settings.redis_url, backend=settings.redis_url)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        # Results collected after the test Redis stopped must not retry for ever.
        result_backend_transport_options={"retry_policy": {"max_retries": 0}},
    )
    PLAIN_APPS.append(app)
    return app
