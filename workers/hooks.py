"""What hangs off an executor's transitions: logs, metrics and Celery task events.

Hooks run on the returner thread, so they never hold up a compute: `counters` just
before a batch's results are stored (what they return is added in the same round trip),
`batch_done` after. A hook that raises is logged and skipped.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Protocol

from tandem.broker import metrics
from tandem.broker.errors import DeadlineExceeded, ModelError, Revoked
from tandem.broker.message import TASK_NAME, short
from tandem.workers.computed import Computed

#: The host stages a staged batch is timed in, each its own histogram (workers/stages.py).
STAGES = ("collate", "copy_in", "copy_out", "split")


class HasId(Protocol):
    """What a hook reads of the executor it hangs off (workers/executor.py's Executor)."""

    id: str
    model_ref: str  # NAME:VERSION


log = logging.getLogger("tandem.executor")


class Hook:
    def counters(self, executor: HasId, done: Computed) -> Counter:
        """Metrics counters to add to the model's hash with the batch's results."""
        return Counter()

    def batch_done(self, executor: HasId, done: Computed) -> None:
        """A batch's results are stored."""

    def state_changed(self, executor: HasId, state: str) -> None:
        """The executor moved to `state`."""


class Logs(Hook):
    """One line per event: state changes at DEBUG, failures at WARNING, never a traceback.
    Tasks shed for their deadlines (many at a time under overload) make one line per
    batch, and one per task at DEBUG."""

    def batch_done(self, executor: HasId, done: Computed) -> None:
        shed = [task for task in done.tasks if isinstance(task.error, DeadlineExceeded)]
        if shed:
            log.warning(
                "tasks_shed executor=%s count=%d reason=DeadlineExceeded: %s",
                executor.id,
                len(shed),
                shed[0].error,
            )
        for task in done.tasks:
            if isinstance(task.error, DeadlineExceeded):
                log.debug("task_shed executor=%s task=%s: %s", executor.id, task.id, task.error)
            elif isinstance(task.error, Revoked):
                log.info("task_revoked executor=%s task=%s", executor.id, task.id)
            elif task.error is not None:
                log.warning(
                    "task_failed executor=%s task=%s reason=%s: %s",
                    executor.id,
                    task.id or "-",
                    type(task.error).__name__,
                    task.error,
                )
        log.debug(
            "batch_done executor=%s size=%d compute_ms=%.1f",
            executor.id,
            len(done.outputs),
            done.compute_ms,
        )

    def state_changed(self, executor: HasId, state: str) -> None:
        log.debug("state executor=%s state=%s", executor.id, state)


class Metrics(Hook):
    """Counters and histograms of each batch, for the model's metrics hash. done.stored_at
    is when the store was sent, so latency ends there."""

    def counters(self, executor: HasId, done: Computed) -> Counter:
        counts: Counter = Counter()
        if done.outputs:
            metrics.observe(counts, "batch_size", len(done.outputs))
            # The forward pass alone, where the stages were timed apart.
            metrics.observe(counts, "compute_ms", done.stages.get("compute", done.compute_ms))
            if done.device_ms is not None:
                metrics.observe(counts, "device_ms", done.device_ms)
            for stage in STAGES:
                if stage in done.stages:
                    metrics.observe(counts, f"{stage}_ms", done.stages[stage])
        for n, task in enumerate(done.tasks):
            counts["outcome:FAILURE" if task.error else "outcome:SUCCESS"] += 1
            if task.error is not None:
                counts[f"failure:{type(task.error).__name__}"] += 1
            elif task.deadline is None or done.stored_at <= task.deadline:
                counts["deadline:met"] += 1  # goodput: a success in time
            else:
                counts["deadline:missed"] += 1  # computed, but too late to be worth anything
            if task.sent_at:
                metrics.observe(counts, "latency_ms", (done.stored_at - task.sent_at) * 1000)
                if n in done.outputs:
                    metrics.observe(
                        counts, "queue_wait_ms", max(0.0, done.claimed_at - task.sent_at) * 1000
                    )
        return counts


class CeleryEvents(Hook):
    """Celery task events, so Flower shows every task: received, started, succeeded/failed."""

    def __init__(self, app: Any, hostname: str) -> None:
        self.app = app
        self.hostname = hostname
        self._dispatcher: Any = None

    def batch_done(self, executor: HasId, done: Computed) -> None:
        if self._dispatcher is None:  # created on the returner thread that uses it
            self._dispatcher = self.app.events.Dispatcher(
                self.app.connection_for_write(),
                hostname=self.hostname,
                enabled=True,
                buffer_group=["task"],
                buffer_limit=10_000,
            )
        send = self._dispatcher.send
        runtime = done.compute_ms / 1000
        for n, task in enumerate(done.tasks):
            if task.id is None:
                continue
            if isinstance(task.error, Revoked):
                send("task-revoked", uuid=task.id, terminated=False, signum=None, expired=False)
                continue
            send(
                "task-received",
                uuid=task.id,
                name=TASK_NAME,
                args="()",
                kwargs=f"{{'model': {task.model!r}}}",
                retries=0,
                eta=None,
                expires=task.expires.isoformat() if task.expires else None,
                root_id=task.id,
                parent_id=None,
                timestamp=done.claimed_at,
            )
            if task.error is None or isinstance(task.error, ModelError):
                # Only a task that went into the forward pass started: one shed, expired
                # or rejected before it goes from received to failed.
                send("task-started", uuid=task.id, timestamp=done.started_at)
            if task.error is None:
                send(
                    "task-succeeded",
                    uuid=task.id,
                    result=short(done.outputs[n], 200),
                    runtime=runtime,
                    timestamp=done.stored_at,
                )
            else:
                send(
                    "task-failed",
                    uuid=task.id,
                    timestamp=done.stored_at,
                    exception=f"{type(task.error).__name__}({str(task.error)!r})",
                    traceback=None,
                )
        self._dispatcher.flush()
