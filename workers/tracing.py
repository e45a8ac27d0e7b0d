"""Each batch's spans, made by a hook once its results are stored: on the returner thread,
from the times the batch noted, so tracing adds nothing to a task's path.

Per task, in the task's own trace (the child of its producer's send span, whose context
its message carries): a CONSUMER span `process <queue>` from its send to its stored
result, with its outcome, and its child `queue wait`, from its send to its claim. Per
batch, a span `batch <model>` with children `prepare`, `compute` (with the device time)
and `store`, linked to each of its tasks' spans, each of which links back to it: a
batch serves many traces, so it is a trace of its own, as OpenTelemetry's messaging
conventions have batch processing.

The spans are finished when they are made, so they are built as the SDK's ReadableSpan
and handed to its span processor (the exporter's queue), with the SDK's own sampler, ids
and resource: its live spans (a lock, attribute checks on every set, start and end
hooks) cost several times more, per task, than the rest of the worker's work on it.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.trace.propagation import get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tandem.broker import tracing
from tandem.broker.errors import DeadlineExceeded, Revoked
from tandem.broker.message import Task
from tandem.workers.computed import Computed
from tandem.workers.hooks import STAGES, HasId, Hook

_W3C = TraceContextTextMapPropagator()
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)
#: A traceparent's last field, its flags, when its sampled bit is clear (W3C).
_UNSAMPLED = frozenset(f"{n:02x}" for n in range(0, 256, 2))


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def outcome(error: Exception | None) -> str:
    """A task's outcome, as its span says it: success, failure, shed or revoked."""
    if error is None:
        return "success"
    if isinstance(error, DeadlineExceeded):
        return "shed"
    return "revoked" if isinstance(error, Revoked) else "failure"


def usable(tracer: Any) -> bool:
    """Whether the tracer is the SDK's, whose parts this hook builds spans with."""
    return all(
        hasattr(tracer, a) for a in ("sampler", "resource", "id_generator", "span_processor")
    )


def records_nothing(tracer: Any) -> bool:
    """Whether the tracer's sampler drops every span (OTEL_TRACES_SAMPLER=always_off)."""
    return tracer.sampler.get_description() == "AlwaysOffSampler"


class Traces(Hook):
    """The spans of each stored batch (see the module), built with the SDK's parts."""

    def __init__(self, tracer: Any, worker: str) -> None:
        self.sampler = tracer.sampler
        self.resource = tracer.resource
        self.ids = tracer.id_generator
        self.processor = tracer.span_processor
        self.scope = InstrumentationScope(tracing.SCOPE)
        self.worker = worker
        #: The sampler drops a span whose remote parent was not sampled (a parent-based
        #: one, as OTEL_TRACES_SAMPLER sets them): known from the header's flags alone.
        self.follows = "remoteParentNotSampled:AlwaysOffSampler" in self.sampler.get_description()

    def batch_done(self, executor: HasId, done: Computed) -> None:
        claimed, ended = _ns(done.claimed_at), _ns(done.store_ended_at or done.stored_at)
        batch = self._new(self.ids.generate_trace_id())
        linked = (Link(batch),)
        spans: list[SpanContext] = []
        for task in done.tasks:
            sampled = self._sampled(task)
            if sampled is None:
                continue
            parent, trace_id, state = sampled
            own = self._new(trace_id, state)
            spans.append(own)
            sent = min(_ns(task.sent_at) if task.sent_at else claimed, claimed)
            queue = task.queue or task.model
            attributes, status, events = self._outcome(task, done)
            attributes["messaging.destination.name"] = queue
            attributes["messaging.message.id"] = task.id
            self._emit(
                f"process {queue}", own, parent, sent, ended, attributes,
                kind=SpanKind.CONSUMER, status=status, events=events, links=linked,
            )  # fmt: skip
            self._emit("queue wait", self._new(trace_id), own, sent, claimed)
        if spans:
            self._batch(executor, done, batch, spans, claimed, ended)

    def _sampled(self, task: Task) -> tuple[SpanContext | None, int, TraceState] | None:
        """The parent (its producer's send span, if its message says), the trace id and
        the trace state of a task's span, if the sampler records it; None if not, or if
        it has no id."""
        if task.id is None:
            return None  # no task to speak of: it went to the dead letters
        context, parent = None, None
        if task.trace:
            if self.follows and task.trace["traceparent"][-2:] in _UNSAMPLED:
                return None  # its producer's sampler said no
            context = _W3C.extract(task.trace)
            parent = get_current_span(context).get_span_context()
            if not parent.is_valid:
                context, parent = None, None
        trace_id = parent.trace_id if parent is not None else self.ids.generate_trace_id()
        result = self.sampler.should_sample(context, trace_id, "process", SpanKind.CONSUMER)
        if not result.decision.is_sampled():
            return None
        return parent, trace_id, result.trace_state

    @staticmethod
    def _outcome(task: Task, done: Computed) -> tuple[dict[str, Any], Status, tuple]:
        """A task span's attributes, status and events for its outcome."""
        attributes: dict[str, Any] = {
            "messaging.system": "tandem",
            "messaging.operation.type": "process",
            "tandem.outcome": outcome(task.error),
        }
        if task.error is None:
            if task.deadline is not None:
                attributes["tandem.deadline.met"] = done.store_ended_at <= task.deadline
            return attributes, _UNSET, ()
        kind = type(task.error).__name__
        attributes["error.type"] = kind
        events: tuple = ()
        if isinstance(task.error, DeadlineExceeded):
            reason = {"reason": str(task.error)}
            events = (Event("shed", reason, _ns(done.claimed_at)),)
        return attributes, Status(StatusCode.ERROR, f"{kind}: {task.error}"), events

    def _batch(
        self,
        executor: HasId,
        done: Computed,
        batch: SpanContext,
        tasks: list[SpanContext],
        claimed: int,
        ended: int,
    ) -> None:
        """The batch's span, linked to its tasks' spans, and its prepare, compute, store."""
        attributes = {
            "tandem.model": executor.model_ref,
            "tandem.executor": executor.id,
            "tandem.worker": self.worker,
            "tandem.batch.size": len(done.tasks),
            "tandem.batch.computed": len(done.outputs),
            "tandem.batch.shed": sum(isinstance(t.error, DeadlineExceeded) for t in done.tasks),
        }
        links = tuple(Link(task) for task in tasks)
        self._emit(
            f"batch {executor.model_ref}", batch, None, claimed, ended, attributes, links=links
        )
        trace_id = batch.trace_id
        started = _ns(done.started_at)
        self._emit("prepare", self._new(trace_id), batch, claimed, started)
        if done.outputs or done.compute_ms:
            times: dict[str, Any] = {"tandem.compute_ms": done.compute_ms}
            if done.device_ms is not None:
                times["tandem.device_ms"] = done.device_ms
            for stage in STAGES:
                if stage in done.stages:
                    times[f"tandem.{stage}_ms"] = done.stages[stage]
            end = _ns(done.started_at + done.compute_ms / 1000)
            self._emit("compute", self._new(trace_id), batch, started, end, times)
        self._emit("store", self._new(trace_id), batch, _ns(done.stored_at), ended)

    def _new(self, trace_id: int, state: TraceState | None = None) -> SpanContext:
        """A new span's context in this trace, sampled."""
        return SpanContext(trace_id, self.ids.generate_span_id(), False, _SAMPLED, state)

    def _emit(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        start: int,
        end: int,
        attributes: dict[str, Any] | None = None,
        *,
        kind: SpanKind = SpanKind.INTERNAL,
        status: Status = _UNSET,
        events: tuple = (),
        links: tuple = (),
    ) -> None:
        """A finished span, to the exporter's queue."""
        span = ReadableSpan(
            name, context, parent, self.resource, attributes or {}, events, links, kind,
            status=status, start_time=start, end_time=end, instrumentation_scope=self.scope,
        )  # fmt: skip
        self.processor.on_end(span)
