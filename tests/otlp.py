"""An OTLP/HTTP trace receiver for the tests: what a collector or Jaeger is to the
processes under test, which export to it with OpenTelemetry's own OTLP exporter."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from helpers import wait_until


@dataclass
class Span:
    name: str
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int  # OTLP's SpanKind: 2 server, 4 producer, 5 consumer
    start: int  # ns
    end: int
    attributes: dict[str, Any]
    status: tuple[int, str]  # OTLP's code (2: error) and message
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    links: list[tuple[str, str]] = field(default_factory=list)  # (trace id, span id)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


class Receiver:
    """Listens on a free port; `spans` holds every span exported to it."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver._take(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def env(self) -> dict[str, str]:
        """The OTEL_* variables that have a process export every span here, at once."""
        return {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.url,
            "OTEL_BSP_SCHEDULE_DELAY": "50",
        }

    def _take(self, request: Any) -> None:
        for resource in request.resource_spans:
            service = _attributes(resource.resource.attributes).get("service.name", "")
            for scope in resource.scope_spans:
                for s in scope.spans:
                    span = Span(
                        name=s.name,
                        service=service,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(),
                        kind=s.kind,
                        start=s.start_time_unix_nano,
                        end=s.end_time_unix_nano,
                        attributes=_attributes(s.attributes),
                        status=(s.status.code, s.status.message),
                        events=[(e.name, _attributes(e.attributes)) for e in s.events],
                        links=[(x.trace_id.hex(), x.span_id.hex()) for x in s.links],
                    )
                    with self._lock:
                        self.spans.append(span)

    def trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def find(self, name: str, **attributes: Any) -> list[Span]:
        """The spans of this name (or name prefix, ending in a space) with these attributes."""
        with self._lock:
            spans = list(self.spans)
        return [
            s
            for s in spans
            if (s.name == name or (name.endswith(" ") and s.name.startswith(name)))
            and all(s.attributes.get(k) == v for k, v in attributes.items())
        ]

    def one(self, name: str, timeout_s: float = 30, **attributes: Any) -> Span:
        """Wait for the one span of this name with these attributes."""
        found = wait_until(
            lambda: self.find(name, **attributes), timeout_s, f"a span {name!r} {attributes}"
        )
        assert len(found) == 1, found
        return found[0]

    def by_id(self, span_id: str) -> Span:
        with self._lock:
            return next(s for s in self.spans if s.span_id == span_id)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
