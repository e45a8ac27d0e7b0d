"""Each batch's spans, made by a hook once its results are stored: on the returner thread,
from the times the batch noted, so tracing adds nothing to a task's path.

Per task, in the task's own trace (the child of its producer's send span, whose context
its message carries): a CONSUMER span `process <queue>` from its send to its stored
result, with its outcome, and its child `queue wait`, from its send to its claim. Per
batch, a span `batch <model>` with children `prepare`, `compute` (with the device time)
and `store`, linked to each of its tasks' spans, each of which links back to it: a
batch serves many traces, so it is a trace of its own, as OpenTelemetry's messaging
conventions have batch processing.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from tandem.broker.errors import DeadlineExceeded, Revoked
from tandem.workers.computed import Computed
from tandem.workers.hooks import STAGES, HasId, Hook


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def outcome(error: Exception | None) -> str:
    """A task's outcome, as its span says it: success, failure, shed or revoked."""
    if error is None:
        return "success"
    if isinstance(error, DeadlineExceeded):
        return "shed"
    return "revoked" if isinstance(error, Revoked) else "failure"


class Traces(Hook):
    def __init__(self, tracer: Any, worker: str) -> None:
        self.tracer = tracer
        self.worker = worker

    def batch_done(self, executor: HasId, done: Computed) -> None:
        ended = done.store_ended_at or done.stored_at
        spans = [self._task(executor, done, n, ended) for n in range(len(done.tasks))]
        recording = [s for s in spans if s is not None and s.is_recording()]
        batch = self._batch(executor, done, ended, recording) if recording else None
        for span in spans:
            if span is None:
                continue
            if batch is not None and span.is_recording():
                span.add_link(batch.get_span_context())
            span.end(_ns(ended))

    def _task(self, executor: HasId, done: Computed, n: int, ended: float) -> Any:
        """A task's span, started and not ended; its queue wait ended under it."""
        task = done.tasks[n]
        if task.id is None:
            return None  # no task to speak of: it went to the dead letters
        parent = propagate.extract(task.trace) if task.trace else None
        sent = min(task.sent_at or done.claimed_at, done.claimed_at)
        result = outcome(task.error)
        span = self.tracer.start_span(
            f"process {task.queue or task.model}",
            context=parent,
            kind=SpanKind.CONSUMER,
            start_time=_ns(sent),
            attributes={
                "messaging.system": "tandem",
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": task.queue or "",
                "messaging.message.id": task.id,
                "messaging.consumer.group.name": executor.id,
                "tandem.model": task.model,
                "tandem.executor": executor.id,
                "tandem.worker": self.worker,
                "tandem.batch.size": len(done.tasks),
                "tandem.outcome": result,
            },
        )
        if not span.is_recording():
            return span
        self.tracer.start_span(
            "queue wait", context=trace.set_span_in_context(span), start_time=_ns(sent)
        ).end(_ns(done.claimed_at))
        if task.error is not None:
            kind = type(task.error).__name__
            span.set_attribute("error.type", kind)
            span.set_status(Status(StatusCode.ERROR, f"{kind}: {task.error}"))
            if result == "shed":
                span.add_event("shed", {"reason": str(task.error)}, timestamp=_ns(done.claimed_at))
        elif task.deadline is not None:
            span.set_attribute("tandem.deadline.met", ended <= task.deadline)
        return span

    def _batch(self, executor: HasId, done: Computed, ended: float, tasks: list) -> Any:
        """The batch's span and its prepare, compute and store, linked to its tasks."""
        computed = len(done.outputs)
        shed = sum(isinstance(task.error, DeadlineExceeded) for task in done.tasks)
        batch = self.tracer.start_span(
            f"batch {executor.model_ref}",
            start_time=_ns(done.claimed_at),
            links=[Link(span.get_span_context()) for span in tasks],
            attributes={
                "tandem.model": executor.model_ref,
                "tandem.executor": executor.id,
                "tandem.worker": self.worker,
                "tandem.batch.size": len(done.tasks),
                "tandem.batch.computed": computed,
                "tandem.batch.shed": shed,
            },
        )
        under = trace.set_span_in_context(batch)
        start = self.tracer.start_span
        start("prepare", context=under, start_time=_ns(done.claimed_at)).end(_ns(done.started_at))
        if done.compute_ms or computed:
            times = {"tandem.compute_ms": done.compute_ms}
            if done.device_ms is not None:
                times["tandem.device_ms"] = done.device_ms
            for stage in STAGES:
                if stage in done.stages:
                    times[f"tandem.{stage}_ms"] = done.stages[stage]
            compute = start(
                "compute", context=under, start_time=_ns(done.started_at), attributes=times
            )
            compute.end(_ns(done.started_at + done.compute_ms / 1000))
        start("store", context=under, start_time=_ns(done.stored_at)).end(_ns(ended))
        batch.end(_ns(ended))
        return batch
