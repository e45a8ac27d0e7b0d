"""Celery remote control, answered for tandem executors instead of Celery's pool.

Importing this module replaces some of Celery's built-in commands in this process
(Celery's own registry, `Panel`); only the worker imports it.

- revoke: Celery's own revoke (REVOKED stored, the id kept in memory), plus tandem's
  shared, expiring record in Redis, which every executor checks before it computes.
- inspect active / reserved / query_task: the batch computing now, and what each
  executor holds in L2 and in-flight, in Celery's request-info format.
- pool_grow, pool_shrink, autoscale, rate_limit, revoke_by_stamped_headers: a clear
  "not applicable" error, since an executor is one model on one device, not a pool.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import redis
from celery.utils.functional import maybe_list
from celery.worker import control
from celery.worker.control import control_command, inspect_command, nok, ok

from tandem.broker import message, results

log = logging.getLogger("tandem.worker")

_celery_revoke = control.revoke
NOT_A_POOL = "not applicable to tandem executors: one executor is one model on one device"


def _executors(state) -> list:
    step = getattr(state.app, "tandem_executors", None)
    return step.executors if step is not None else []


@control_command(variadic="task_id", signature="[id1 [id2 [... [idN]]]]")
def revoke(state, task_id, terminate=False, signal=None, **kwargs):
    """Revoke tasks by id: never computed if not yet computing, and REVOKED stays."""
    ids = sorted(set(maybe_list(task_id) or []))
    executors = _executors(state)
    if executors and ids:
        try:
            executors[0].table.revoke(ids, executors[0].settings.result_expires_s)
        except redis.RedisError as e:
            log.error("could not record revoked tasks %s in Redis: %s", ids, e)
        for executor in executors:
            executor.revocations = True
    reply = _celery_revoke(state, ids, terminate=False, signal=signal, **kwargs)
    if terminate:
        return ok(
            "terminate: not applicable to tandem executors; a batch that is computing "
            "finishes, and the revoked tasks' results stay REVOKED"
        )
    return reply


@control_command(variadic="headers", signature="[key1=value1 [key2=value2 [...]]]")
def revoke_by_stamped_headers(state, headers, terminate=False, signal=None, **kwargs):
    """Not supported by tandem: revoke by task id. (An 'ok' reply that names no task, as
    Celery's client reads every reply's 'ok'.)"""
    return ok("revoke_by_stamped_headers is not supported by tandem executors; revoke by id")


@inspect_command(alias="dump_active")
def active(state, safe=False, **kwargs):
    """The tasks of each executor's batch that is computing now."""
    return [
        request_info(task, executor, safe=safe, started=started)
        for executor in _executors(state)
        for task, started in executor.computing()
    ]


@inspect_command(alias="dump_reserved")
def reserved(state, **kwargs):
    """What each executor holds in L2 and in-flight, besides the batch computing."""
    return [request_info(t, e) for e in _executors(state) for t in _reserved(e)]


@inspect_command(variadic="ids", signature="[id1 [id2 [... [idN]]]]")
def query_task(state, ids, **kwargs):
    """Where these tasks are: 'active' (computing) or 'reserved' (held by an executor)."""
    wanted = set(maybe_list(ids) or [])
    found = {}
    for executor in _executors(state):
        for task, started in executor.computing():
            if task.id in wanted:
                found[task.id] = ("active", request_info(task, executor, started=started))
        for task in _reserved(executor):
            if task.id in wanted and task.id not in found:
                found[task.id] = ("reserved", request_info(task, executor))
    return found


def _reserved(executor) -> list[message.Task]:
    computing = {task.id for task, _ in executor.computing()}
    try:
        raws = executor.table.reserved(executor.id)
    except redis.RedisError as e:
        log.warning("inspect: cannot read %s's lists: %s", executor.id, e)
        return []
    limit = executor.settings.max_message_bytes
    tasks = [message.decode(raw, max_bytes=limit) for raw in raws]
    return [t for t in tasks if t.id is not None and t.id not in computing]


def request_info(
    task: message.Task, executor, *, safe: bool = False, started: float | None = None
) -> dict[str, Any]:
    """One task as Celery's Request.info() describes it; large inputs are elided."""
    kwargs = results.extended(
        message.TASK_NAME,
        {"model": task.model, "inputs": task.sent_inputs},
        size=len(task.raw),
        worker=executor.worker,
        queue=task.queue,
    )["kwargs"]
    return {
        "id": task.id,
        "name": message.TASK_NAME,
        "args": "()" if safe else [],
        "kwargs": repr(kwargs) if safe else kwargs,
        "type": message.TASK_NAME,
        "hostname": executor.worker,
        "time_start": started,
        "acknowledged": True,
        "delivery_info": {
            "exchange": "",
            "routing_key": task.queue,
            "priority": 0,
            "redelivered": False,
        },
        "worker_pid": os.getpid(),
    }


def _not_a_pool(name: str):
    def refuse(state, *args, **kwargs):
        return nok(f"{name}: {NOT_A_POOL}")

    refuse.__doc__ = f"{name}: {NOT_A_POOL}."
    return refuse


for _name, _args, _signature in (
    ("pool_grow", [("n", int)], "[N=1]"),
    ("pool_shrink", [("n", int)], "[N=1]"),
    ("autoscale", [("max", int), ("min", int)], "[max [min]]"),
    ("rate_limit", [("task_name", str), ("rate_limit", str)], "<task_name> <rate_limit>"),
):
    control_command(name=_name, args=_args, signature=_signature)(_not_a_pool(_name))
