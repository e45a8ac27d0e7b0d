"""`tandem bench --tracing`: a profile run with tandem's traces off, on with the sampler
off, or on at 100 % to an OTLP/HTTP sink. The sink is a process of its own, as a
collector would be, so its work is not counted as tandem's; it counts the spans it got.

    python -m tandem.tools.tracesink PORT     # the sink itself
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tandem.broker import tracing
from tandem.server import free_port


class Sink:
    """The sink process, on a free port of this host."""

    def __init__(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen([sys.executable, "-m", __name__, str(port)])
        deadline = time.monotonic() + 30
        while self.spans() is None:
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.process.kill()
                raise RuntimeError("the trace sink did not start")
            time.sleep(0.05)  # polling the sink's port, bounded by the deadline

    def spans(self) -> int | None:
        """How many spans it has received; None while it does not answer."""
        try:
            with urllib.request.urlopen(self.url + "/count", timeout=2) as reply:
                return json.loads(reply.read())["spans"]
        except OSError:
            return None

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def sampler(mode: str) -> dict[str, str]:
    """OTEL_TRACES_SAMPLER (and its argument) for a mode: sampler-off, on, or a ratio of
    traces (0 to 1). Raises ValueError for anything else."""
    if mode == "sampler-off":
        return {"OTEL_TRACES_SAMPLER": "always_off"}
    if mode == "on":
        return {"OTEL_TRACES_SAMPLER": "parentbased_always_on"}
    ratio = float(mode)
    if not 0 < ratio <= 1:
        raise ValueError(f"a ratio of traces is over 0 and at most 1, got {mode}")
    return {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": mode}


@contextmanager
def traced(mode: str) -> Iterator[Sink | None]:
    """Set OTEL_* for this process and every process it starts, for `mode` (off, or as
    `sampler` takes it); the sink that receives the spans, unless off."""
    if mode == "off":
        yield None
        return
    chosen = sampler(mode)
    sink = Sink()
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url,
        # Spans exported every 100 ms, so that a run's own are exported within it.
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_TRACES_SAMPLER_ARG": "",
        **chosen,
    }
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    tracing.reset()
    try:
        yield sink
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        tracing.reset()
        sink.stop()


def serve(port: int) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    count = [0]
    lock = threading.Lock()
    reply = ExportTraceServiceResponse().SerializeToString()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the exporter's session expects

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = ExportTraceServiceRequest.FromString(body)
            n = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
            with lock:
                count[0] += n
            self._answer(reply, "application/x-protobuf")

        def do_GET(self) -> None:
            self._answer(json.dumps({"spans": count[0]}).encode(), "application/json")

        def _answer(self, body: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    serve(int(sys.argv[1]))
