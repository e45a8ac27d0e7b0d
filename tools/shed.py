"""What shedding costs in bulk: part of `tandem bench --profile overload`.

One worker of a sim model that takes 2 s a batch computes one task. Meanwhile N tasks
land in L1 from a plain Celery publisher (as from a producer that skips the route), each
due 3.5 s later: not past when it is claimed, but sure to miss by the latency model, so
each is shed at claim by prediction. Measured from the end of the push to the last
FAILURE received: the worker's CPU (user + system, from /proc) and Redis's CPU, per task.
"""

from __future__ import annotations

import json
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from tandem.broker import keys, message
from tandem.broker.settings import Settings
from tandem.tools.harness import SYSTEMS, Point, Recorder, RedisMeter, process_cpu_s

MODEL = "sim:1"
COMPUTE_MS = 2000.0
DUE_S = 3.5
TITLE = "the cost of shedding at claim, one worker (CPU per task)"
COLUMNS = (
    "what",
    "tasks",
    "answered",
    "shed_by_prediction",
    "worker_cpu_us_per_task",
    "redis_cpu_us_per_task",
    "elapsed_s",
)


def measure(settings: Settings, tasks: int) -> list[dict[str, Any]]:
    """Two rows: N tasks shed at claim, and, for scale, N tasks computed by a zero-cost
    sim in the same way (no deadlines)."""
    return [_run(settings, tasks, shed=True), _run(settings, tasks, shed=False)]


def _run(settings: Settings, tasks: int, *, shed: bool) -> dict[str, Any]:
    settings = settings.replace(
        models=(MODEL,),
        sim_base_ms=COMPUTE_MS if shed else 0.0,
        sim_per_item_ms=0.0,
        max_wait_ms=0.0,
    )
    with tempfile.TemporaryDirectory(prefix="tandem-shed-") as folder:
        point = Point(SYSTEMS["tandem"], settings, 1, Path(folder))
        try:
            recorder = Recorder(point.url)
            try:
                return _measure(point, recorder, tasks, shed=shed)
            finally:
                recorder.collect()
        finally:
            point.close()


def _measure(point: Point, recorder: Recorder, tasks: int, *, shed: bool) -> dict[str, Any]:
    client = point.client
    assert client is not None  # a tandem point
    client.submit(MODEL, 0).get(timeout=30)  # the latency model's first batch
    client.submit(MODEL, 1)  # the executor computes this one (for 2 s when shedding)
    expires = datetime.now(timezone.utc) + timedelta(seconds=DUE_S) if shed else None
    queue = keys.l1(MODEL)
    encoded = [message.encode(MODEL, n, queue=queue, expires=expires) for n in range(tasks)]
    envelopes = [envelope for _, envelope in encoded]
    with point.redis.pipeline(transaction=False) as pipe:
        for start in range(0, tasks, 1000):
            pipe.lpush(queue, *envelopes[start : start + 1000])
        pipe.execute()
    pid = point.processes[0].pid
    meter, cpu0, t0 = RedisMeter(point.redis).start(), process_cpu_s(pid), time.monotonic()
    got = recorder.wait(2 + tasks, 60, point.check)
    elapsed, worker_cpu = time.monotonic() - t0, process_cpu_s(pid) - cpu0
    redis_cpu = meter.read()["cpu_s"]
    ids = [task_id for task_id, _ in encoded]
    return {
        "what": "shed at claim" if shed else "computed (zero-cost sim)",
        "tasks": tasks,
        "answered": got - 2,
        "shed_by_prediction": _predicted(point, ids) if shed else 0,
        "worker_cpu_us_per_task": round(worker_cpu / tasks * 1e6, 1),
        "redis_cpu_us_per_task": round(redis_cpu / tasks * 1e6, 1),
        # When shedding, this includes the rest of the 2 s compute in hand.
        "elapsed_s": round(elapsed, 2),
    }


def _predicted(point: Point, task_ids: list[str]) -> int:
    """How many of the tasks' stored results say they were shed by prediction (rather than
    found already expired)."""
    with point.redis.pipeline(transaction=False) as pipe:
        for task_id in task_ids:
            pipe.get(keys.result(task_id))
        stored = pipe.execute()
    return sum(
        1 for raw in stored if raw and "would miss its deadline" in str(json.loads(raw)["result"])
    )
