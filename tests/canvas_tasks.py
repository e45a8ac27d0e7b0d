"""Follow-up tasks for canvas tests, run by a plain Celery worker on the queue `followups`.

Run as ``python -m canvas_tasks`` with TANDEM_REDIS_URL set and tests/ on PYTHONPATH.
"""

from __future__ import annotations

import os

from celery import Celery

app = Celery(
    "followups", broker=os.environ["TANDEM_REDIS_URL"], backend=os.environ["TANDEM_REDIS_URL"]
)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_default_queue="followups",
)


@app.task(name="followups.total")
def total(values):
    """The sum of a list, or of a list of lists (a chord's header results)."""
    return sum(sum(v) if isinstance(v, list) else v for v in values)


@app.task(name="followups.record")
def record(value, key):
    """Keep what arrived under `key` in Redis, for the test to read."""
    app.backend.client.rpush(key, repr(value))
    return value


if __name__ == "__main__":
    app.worker_main(
        ["worker", "--pool=solo", "--queues=followups", "--without-mingle", "--without-gossip"]
    )
