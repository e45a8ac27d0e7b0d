"""The producer side's spans (broker/tracing.py says when there are any): a send span per
submit call, whose context every message of the call carries in its headers, and the
gateways' server spans, which take the caller's traceparent. Attribute names follow
OpenTelemetry's semantic conventions (messaging.*, http.*, rpc.*); tandem.* are ours.

Each function is called only with a tracer, so OpenTelemetry is imported by then."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

#: messaging.system: tandem's own protocol on Redis lists.
SYSTEM = "tandem"
#: The messages carry W3C Trace Context (traceparent, tracestate), which workers read,
#: whatever propagators OTEL_PROPAGATORS names for the process's other calls.
_W3C = TraceContextTextMapPropagator()


class Send:
    """One submit call's PRODUCER span, current context's child: started before its
    messages are encoded (each carries its context as `headers`), ended once they are
    routed or refused, with the route each took."""

    __slots__ = ("span", "headers")

    def __init__(self, tracer: Any, model: str, queue: str, count: int) -> None:
        self.span = span = tracer.start_span(f"send {queue}", kind=SpanKind.PRODUCER)
        if span.is_recording():
            span.set_attributes(
                {
                    "messaging.system": SYSTEM,
                    "messaging.operation.type": "send",
                    "messaging.operation.name": "send",
                    "messaging.destination.name": queue,
                    "tandem.model": model,
                }
            )
            if count != 1:
                span.set_attribute("messaging.batch.message_count", count)
        # Sampled or not, the decision travels: a worker's parent-based sampler follows it.
        self.headers: dict[str, str] = {}
        _W3C.inject(self.headers, context=trace.set_span_in_context(span))

    def routed(self, task_ids: Sequence[str], replies: Sequence[Any]) -> None:
        """End it: replies holds each task's executor (its L2), None (L1) or the error
        that refused it."""
        span = self.span
        if span.is_recording():
            refused = [r for r in replies if isinstance(r, Exception)]
            if len(task_ids) == 1 and len(replies) == 1:
                span.set_attribute("messaging.message.id", task_ids[0])
                if not refused:
                    span.set_attribute("tandem.route", "L2" if replies[0] else "L1")
                    span.set_attribute("tandem.executor", replies[0] or "")
            else:
                executors = [r for r in replies if isinstance(r, str)]
                span.set_attribute("tandem.routed.l2", len(executors))
                span.set_attribute("tandem.routed.l1", len(replies) - len(executors) - len(refused))
                span.set_attribute("tandem.executors", sorted(set(executors)))
            if refused:
                span.set_attribute("tandem.refused", len(refused))
                _error(span, refused[0])
        span.end()

    def failed(self, error: BaseException) -> None:
        """End it: nothing was enqueued."""
        if self.span.is_recording():
            _error(self.span, error)
        self.span.end()


def _error(span: Any, error: BaseException) -> None:
    span.set_attribute("error.type", type(error).__name__)
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


@contextmanager
def serving(
    tracer: Any, name: str, carrier: Mapping[str, str], attributes: dict[str, Any]
) -> Iterator[Any]:
    """A gateway call's SERVER span, the current span while it runs: the child of the
    caller's traceparent, if `carrier` (its headers or metadata) has one."""
    parent = propagate.extract(carrier)
    span = tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)
    with trace.use_span(
        span, end_on_exit=True, record_exception=False, set_status_on_exception=False
    ):
        yield span


def answered(
    span: Any, attributes: dict[str, Any], error_type: str | None = None, message: str = ""
) -> None:
    """Note a server span's outcome: its status attributes, and an error where it is the
    server's fault or a refusal (a caller's bad request leaves the status unset, as the
    conventions ask)."""
    if not span.is_recording():
        return
    span.set_attributes(attributes)
    if error_type is not None:
        span.set_attribute("error.type", error_type)
        span.set_status(Status(StatusCode.ERROR, f"{error_type}: {message}"))
