"""The span of a task ended without a compute, by a role other than an executor: a CONSUMER
span `process <queue>` in the task's own trace, the child of its producer's send span,
from its send to now, as a worker's span ends at a stored result. The coordinator makes
one for a poison task it quarantined (the workers that died holding it made none), and
`tandem purge` one for each task it removed from a first-level queue. Imported only
when the process traces (broker/tracing.py)."""

from __future__ import annotations

import time
from typing import Any

from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tandem.broker.errors import PoisonMessage, Revoked
from tandem.broker.message import Task

_W3C = TraceContextTextMapPropagator()


def buried(tracer: Any, task: Task, error: PoisonMessage, executors: list[str]) -> None:
    """The span of a task buried after the executors named died holding it."""
    ended(tracer, task, "failure", error, "quarantined", {"tandem.executors": executors})


def purged(tracer: Any, task: Task, error: Revoked) -> None:
    """The span of a task removed from its first-level queue and answered REVOKED."""
    ended(tracer, task, "revoked", error, "purged", {})


def ended(
    tracer: Any, task: Task, outcome: str, error: Exception, event: str, details: dict
) -> None:
    """A task's span that says how it ended, unrun: its outcome and error, and an event."""
    context = _W3C.extract(task.trace) if task.trace else None
    queue = task.queue or task.model or ""
    now = time.time()
    sent = task.sent_at if task.sent_at is not None and 0 <= task.sent_at <= now else now
    span = tracer.start_span(
        f"process {queue}", context=context, kind=SpanKind.CONSUMER, start_time=int(sent * 1e9)
    )
    if span.is_recording():
        span.set_attributes(
            {
                "messaging.system": "tandem",
                "messaging.operation.type": "process",
                "messaging.destination.name": queue,
                "messaging.message.id": task.id or "",
                "tandem.model": task.model or "",
                "tandem.outcome": outcome,
                "error.type": type(error).__name__,
            }
        )
        span.add_event(event, details)
        span.set_status(Status(StatusCode.ERROR, str(error)))
    span.end()
