"""Emptying a model's first-level queue (`tandem purge`), as `celery purge` empties a
Celery queue. Each removed task is answered REVOKED, so a caller waiting on it learns
at once rather than at its timeout; a task that already has a result keeps it."""

from __future__ import annotations

import functools
from typing import Any

import redis

from tandem.broker import keys, message, results
from tandem.broker.errors import Revoked
from tandem.broker.readmodel import typed

#: Messages taken from a list, and answered, per round trip.
BATCH = 1000


def purge(
    client: redis.Redis, model: str, *, result_expires_s: int, max_bytes: int, tracer: Any = None
) -> int:
    """Remove every task in the model's L1 at every priority, each batch in one atomic
    RPOP; what arrives meanwhile stays. Returns how many were removed. tracer: this
    process's (broker/tracing.py), when it traces: each task answered gets its span."""
    removed = 0
    for key in keys.l1_keys(model):
        left = typed(key, 0, functools.partial(client.llen, key))
        while left > 0:
            raws: list[bytes] = client.rpop(key, min(BATCH, left)) or []  # type: ignore[assignment]
            if not raws:
                break  # taken by an executor meanwhile
            left -= len(raws)
            removed += len(raws)
            _answer(
                client,
                raws,
                f"purged from the first-level queue of {model}",
                result_expires_s,
                max_bytes,
                tracer,
            )
    return removed


def _answer(
    client: redis.Redis,
    raws: list[bytes],
    reason: str,
    expires_s: int,
    max_bytes: int,
    tracer: Any,
) -> None:
    """A REVOKED result for each message with a usable task id, published as Celery's
    backend publishes one; a result already stored is left as it is."""
    tasks: dict[str, message.Task] = {}  # by id, the first of each
    for raw in raws:
        task = message.decode(raw, max_bytes=max_bytes)
        if task.id:
            tasks.setdefault(task.id, task)
    ids = list(tasks)
    metas = [results.revoked(task_id, reason) for task_id in ids]
    with client.pipeline(transaction=False) as pipe:
        for task_id, meta in zip(ids, metas, strict=True):
            pipe.set(keys.result(task_id), meta, nx=True, ex=expires_s)
        stored = pipe.execute()
    with client.pipeline(transaction=False) as pipe:
        for task_id, meta, new in zip(ids, metas, stored, strict=True):
            if new:
                pipe.publish(keys.result(task_id), meta)
        pipe.execute()
    if tracer is not None:
        from tandem.broker.spans import purged

        for task_id, new in zip(ids, stored, strict=True):
            if new:
                purged(tracer, tasks[task_id], Revoked(f"task {task_id} was {reason}"))
