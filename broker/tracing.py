"""OpenTelemetry traces: whether this process records them, and the W3C trace context a
task's message carries.

Tracing is on when the `[otel]` extra is installed and OpenTelemetry's own variables ask
for it: OTEL_TRACES_EXPORTER (console, otlp, ...; not none), or an OTLP endpoint
(OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT). The SDK then reads the
rest as it always does: OTEL_TRACES_SAMPLER and its argument, OTEL_SERVICE_NAME,
OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_*. An application that set up OpenTelemetry itself
(a tracer provider of its own) needs no variable: tandem's spans join its traces.

Off, nothing of OpenTelemetry is imported and the task path does no more than ask
`tracer()` once per client or executor.
"""

from __future__ import annotations

import logging
import os
import sys
from importlib.metadata import entry_points
from typing import Any

from tandem.broker.errors import BadArgument
from tandem.broker.extras import install_hint

log = logging.getLogger("tandem.tracing")

#: The message headers that carry a task's trace context (W3C Trace Context), as
#: opentelemetry-instrumentation-celery writes them into a Celery message's headers.
HEADERS = ("traceparent", "tracestate")
#: The instrumentation scope of tandem's spans.
SCOPE = "tandem"
#: OpenTelemetry's variables that turn tracing on (any of them set, and not to "none").
ASKING = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)

_decided = False
_tracer: Any = None
#: The tracer provider tandem set up from OTEL_*, if it did: not an application's own.
_ours: Any = None


def tracer(service: str = "tandem") -> Any:
    """This process's tracer, or None when it records no traces. Decided on the first
    call, which also sets up the SDK from OTEL_* if they ask for it: `service` names the
    process where OTEL_SERVICE_NAME does not."""
    global _decided, _tracer
    if not _decided:
        _tracer = _make(service, os.environ)
        _decided = True
    return _tracer


def reset() -> None:
    """Decide again on the next tracer() call (for tests that change the environment)."""
    global _decided, _tracer
    _decided, _tracer = False, None


def asked(env: Any) -> bool:
    """Whether OTEL_* variables ask for traces (OTEL_SDK_DISABLED=true says no)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER")
    if exporter is not None:
        return exporter.strip().lower() not in ("", "none")
    return any(env.get(name) for name in ASKING[1:])


def _make(service: str, env: Any) -> Any:
    global _ours
    if not asked(env):
        # An application that set up OpenTelemetry before it made a Client: join it.
        api = sys.modules.get("opentelemetry.trace")
        if api is None:
            return None
        provider = api.get_tracer_provider()
        if provider is _ours or isinstance(provider, api.ProxyTracerProvider):
            return None
        return api.get_tracer(SCOPE)
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as e:
        log.warning(
            "OTEL_* variables ask for traces, but OpenTelemetry's SDK is not installed (%s); "
            "this process records none. Install it: %s",
            e,
            install_hint("otel"),
        )
        return None
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""
        )
        provider = TracerProvider(
            resource=Resource.create({} if named else {"service.name": service})
        )
        for exporter in exporters(env):
            provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        _ours = provider
    return trace.get_tracer(SCOPE)


def exporters(env: Any) -> list[Any]:
    """The span exporters OTEL_TRACES_EXPORTER names (default otlp), each found by its
    entry point as the SDK's own configurator finds it; otlp is otlp_proto_grpc unless
    OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL says http/protobuf."""
    names = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "grpc"
    ).strip()
    found = []
    for name in names:
        if name == "otlp":
            name = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}.get(protocol, "")
            if not name:
                raise BadArgument(
                    f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r} is not grpc or http/protobuf"
                )
        points = entry_points(group="opentelemetry_traces_exporter", name=name)
        if not points:
            raise BadArgument(
                f"OTEL_TRACES_EXPORTER names {name!r}, which no installed package provides; "
                f"{install_hint('otel')} brings console, otlp_proto_grpc and otlp_proto_http"
            )
        found.append(next(iter(points)).load()())
    return found


def carried(headers: dict) -> dict[str, str] | None:
    """The trace context a message's headers carry, or None."""
    parent = headers.get("traceparent")
    if not isinstance(parent, str):
        return None
    state = headers.get("tracestate")
    return (
        {"traceparent": parent, "tracestate": state}
        if isinstance(state, str)
        else {"traceparent": parent}
    )
