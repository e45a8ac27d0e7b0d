"""Celery canvas for tandem.infer: link, link_error, chains, chords and groups.

What Celery's tracer does after a task runs, done for each task of a computed batch, with
Celery's own pieces: signatures publish the next steps, and the result backend's
mark_as_done / mark_as_failure run the chord's part-return, the chain's failure
propagation and the errbacks. Callbacks and the next chain step are published before
the results are stored, as Celery does (a crash in between publishes them again on
redelivery: at least once); the chord part and the errbacks come after the store.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from celery import group, signature
from celery.app.task import Context
from kombu.exceptions import OperationalError

from tandem.broker import message
from tandem.broker.errors import BadInput, Revoked

log = logging.getLogger("tandem.executor")


class Canvas:
    """The next steps of tasks that carry callbacks, errbacks, a chain, a chord or a group."""

    def __init__(self, app: Any, hostname: str) -> None:
        self.app = app
        self.hostname = hostname

    def before_store(self, task: message.Task, output: Any) -> None:
        """A success: publish link callbacks and the next chain step with its result.

        A step that cannot be published for a reason other than the broker (a malformed
        signature) fails the task with BadInput, so the chain's caller hears of it.
        Broker errors propagate: the batch is then returned again later."""
        if task.canvas is None or task.error is not None:
            return
        try:
            self._publish_next(task, output)
        except (redis.RedisError, OperationalError):
            raise
        except Exception as e:  # noqa: BLE001 - hostile signatures fail this task alone
            task.error = BadInput(f"next canvas step not published: {type(e).__name__}: {e}")

    def _publish_next(self, task: message.Task, output: Any) -> None:
        ctx = self.context(task)
        options = {"parent_id": task.id, "root_id": ctx.root_id or task.id}
        if ctx.callbacks:
            sigs = [signature(s, app=self.app) for s in ctx.callbacks]
            for g in [s for s in sigs if isinstance(s, group)]:
                g.apply_async((output,), **options)
            plain = [s for s in sigs if not isinstance(s, group)]
            if len(plain) == 1 and len(sigs) == 1:
                plain[0].apply_async((output,), **options)
            elif plain:
                group(plain, app=self.app).apply_async((output,), **options)
        if ctx.chain:
            step = signature(ctx.chain[-1], app=self.app)
            step.apply_async((output,), chain=ctx.chain[:-1], **options)

    def after_store(self, task: message.Task, output: Any) -> None:
        """The chord part (success or failure), and a failure's errbacks and chain."""
        if task.canvas is None or task.id is None or isinstance(task.error, Revoked):
            return
        ctx = self.context(task)
        backend = self.app.backend
        try:
            if task.error is None:
                backend.mark_as_done(task.id, output, request=ctx, store_result=False)
            else:
                traceback = getattr(task.error, "traceback", None)
                backend.mark_as_failure(task.id, task.error, traceback, request=ctx)
        except Exception as e:  # noqa: BLE001 - a bad callback never stops results flowing
            log.error("canvas step after task %s failed: %s: %s", task.id, type(e).__name__, e)

    def context(self, task: message.Task) -> Context:
        """The task's request, as Celery's worker would have built it."""
        return Context(
            {
                **(task.canvas or {}),
                "id": task.id,
                "task": message.TASK_NAME,
                "hostname": self.hostname,
                "delivery_info": {"routing_key": task.queue, "exchange": ""},
                "args": [],
                "kwargs": {"model": task.model},
            }
        )
