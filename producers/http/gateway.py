"""What every endpoint shares: the async client, the limits, auth, errors as HTTP, metrics.

The gRPC service (producers/grpc/) shares the same Gateway: one client, one concurrency
bound and one registry of metrics for both protocols.

Every error a caller can cause is an HTTPError: a status, a message, and for 503 a
Retry-After. tandem's own errors map onto them in one place, `http_error`.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response

from tandem.broker.errors import (
    BadArgument,
    BadInput,
    BrokerUnavailable,
    DeadlineExceeded,
    Overloaded,
    QueueFull,
    UnknownModel,
)
from tandem.producers.aio import AsyncClient


@dataclass(frozen=True)
class Limits:
    #: Largest request body, in bytes.
    max_body_bytes: int = 32 * 1024 * 1024
    #: Requests computed at once; more get 503 at once.
    max_concurrency: int = 256
    #: Seconds a client may take to send its body.
    body_timeout_s: float = 30.0
    #: Seconds a request waits for its results when it sets no deadline and its model
    #: has no SLO.
    request_timeout_s: float = 30.0
    #: Items one request may hold (its batch dimension).
    max_items: int = 1024


class Deadline:
    """`with Deadline(s):` cancels the awaiting task after s seconds and raises
    TimeoutError from the block; a timer, with no task or future of its own (cheaper
    than asyncio.wait_for, which wraps what it awaits in a task)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.expired = False

    def __enter__(self) -> Deadline:
        self._task = asyncio.current_task()
        self._timer = asyncio.get_running_loop().call_later(self.timeout_s, self._expire)
        return self

    def _expire(self) -> None:
        self.expired = True
        if self._task is not None:
            self._task.cancel()

    def __exit__(self, kind, value, traceback) -> None:
        self._timer.cancel()
        if self.expired and kind is asyncio.CancelledError:
            uncancel = getattr(self._task, "uncancel", None)  # Python 3.11+
            if uncancel is not None:
                uncancel()
            raise TimeoutError


class HTTPError(Exception):
    def __init__(self, status: int, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s

    def response(self) -> JSONResponse:
        headers = {}
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        if self.status == 401:
            headers["WWW-Authenticate"] = "Bearer"
        return JSONResponse({"error": str(self)}, status_code=self.status, headers=headers)


def http_error(e: Exception) -> HTTPError:
    """tandem's error as the HTTP answer a caller gets."""
    if isinstance(e, HTTPError):
        return e
    if isinstance(e, (BadInput, BadArgument)):
        return HTTPError(400, str(e))
    if isinstance(e, UnknownModel):
        return HTTPError(404, str(e))
    if isinstance(e, Overloaded):  # no live executor: an infinite wait, so look again soon
        late_s = e.wait_s - e.deadline_s
        return HTTPError(503, str(e), retry_after_s=late_s if math.isfinite(late_s) else 1)
    if isinstance(e, (QueueFull, BrokerUnavailable)):
        return HTTPError(503, str(e), retry_after_s=1)
    if isinstance(e, DeadlineExceeded):
        return HTTPError(504, str(e))
    return HTTPError(500, f"{type(e).__name__}: {e}")


#: A failed task's exc_type -> the error raised for it.
FAILED = {"BadInput": BadInput, "DeadlineExceeded": DeadlineExceeded, "UnknownModel": UnknownModel}


def task_error(meta: dict) -> Exception:
    """The error of a task whose result is not SUCCESS."""
    result = meta.get("result")
    if not isinstance(result, dict):
        return HTTPError(500, f"the task ended {meta.get('status')}")
    kind = str(result.get("exc_type"))
    words = result.get("exc_message")
    text = " ".join(map(str, words)) if isinstance(words, list) else str(words)
    return FAILED.get(kind, lambda m: HTTPError(500, f"{kind}: {m}"))(text)


class Metrics:
    """The gateway's requests, over HTTP and gRPC alike, each labelled with its protocol;
    the route is an HTTP path or a gRPC method, the status an HTTP status or a gRPC code."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "tandem_gateway_requests",
            "Requests by protocol, route (a gRPC method) and status (a gRPC code).",
            ["protocol", "route", "status"],
            registry=self.registry,
        )
        self.seconds = Histogram(
            "tandem_gateway_request_duration_seconds",
            "Request latency, from the request's start to its response.",
            ["protocol", "route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "tandem_gateway_in_flight",
            "Inference requests being served (those the concurrency bound counts).",
            ["protocol"],
            registry=self.registry,
        )
        self.items = Counter(
            "tandem_gateway_items",
            "Tasks submitted through the gateway.",
            ["protocol", "model"],
            registry=self.registry,
        )
        self._children: dict[tuple[str, str, str], tuple] = {}

    def observe(self, protocol: str, route: str, status: str, seconds: float) -> None:
        """Count one request and its latency (the labelled children kept, not looked up)."""
        key = (protocol, route, status)
        children = self._children.get(key)
        if children is None:
            children = self.requests.labels(*key), self.seconds.labels(protocol, route)
            self._children[key] = children
        children[0].inc()
        children[1].observe(seconds)


class Gateway:
    """The state one gateway process shares between requests."""

    def __init__(self, client: AsyncClient, limits: Limits, token: str | None = None) -> None:
        self.client = client
        self.limits = limits
        self.token = token
        self.metrics = Metrics()
        self.busy = 0
        #: OpenTelemetry's tracer when this process traces: a server span per inference call.
        self.tracer = client.tracer

    def admit(self, protocol: str) -> bool:
        """Count one more inference request in flight; False past the bound (the caller
        answers it at once). Each admitted request is released once."""
        if self.busy >= self.limits.max_concurrency:
            return False
        self.busy += 1
        self.metrics.in_flight.labels(protocol).inc()
        return True

    def release(self, protocol: str) -> None:
        self.busy -= 1
        self.metrics.in_flight.labels(protocol).dec()

    async def not_ready(self) -> str | None:
        """Why the gateway is not ready (Redis does not answer, or the result reader
        stopped), or None while it is."""
        if not self.client.reading:
            return "the result reader is not running"
        try:
            await asyncio.wait_for(self.client.redis.ping(), 2.0)
        except Exception as e:  # noqa: BLE001 - not ready, whatever the reason
            return f"Redis does not answer: {type(e).__name__}"
        return None

    def check_auth(self, call: Call) -> None:
        if not self.token:
            return
        scheme, _, value = call.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            value.strip().encode(), self.token.encode()
        ):
            raise HTTPError(401, "a valid 'Authorization: Bearer <token>' header is required")

    async def read_body(self, call: Call) -> bytes:
        """The request body, within the size limit and the time limit."""
        limit = self.limits.max_body_bytes
        declared = call.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise HTTPError(413, f"the body is over the {limit}-byte limit")
        encoding = call.headers.get("content-encoding", "identity").lower()
        if encoding != "identity":
            raise HTTPError(415, f"Content-Encoding {encoding[:32]!r} is not accepted")
        chunks, size = [], 0
        try:
            with Deadline(self.limits.body_timeout_s):
                while True:
                    message = await call.receive()
                    if message["type"] == "http.disconnect":
                        raise ClientDisconnect
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise HTTPError(413, f"the body is over the {limit}-byte limit")
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise HTTPError(408, "the body was not sent in time") from None
        return b"".join(chunks)


class Call:
    """One request as an endpoint sees it, read from the ASGI scope: the method, the
    path's parameters, the headers (lower-case names; the last of a repeated one), and
    the body once the endpoint's wrapper has read it."""

    __slots__ = ("scope", "method", "path", "path_params", "headers", "receive", "body")

    def __init__(self, scope: dict, receive) -> None:
        self.scope = scope
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.path_params: dict = scope.get("path_params", {})
        self.headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        self.receive = receive
        self.body = b""


Handler = Callable[[Gateway, Call], Awaitable[Response]]


class Endpoint:
    """An ASGI endpoint around a handler: its metrics under `route`; 405 for another
    method than `method` (GET takes HEAD too); auth unless unguarded; for a bounded one,
    the body read first (a slow sender holds no slot), then the concurrency bound; every
    error answered as HTTP. Plain ASGI, not Starlette's Request: this is every request's
    path, and Starlette's request machinery costs more than the rest of it."""

    def __init__(self, handler: Handler, route: str, method: str, guarded: bool, bounded: bool):
        self.handler = handler
        self.route = route
        self.method = method
        self.allowed = {method, "HEAD"} if method == "GET" else {method}
        self.guarded = guarded
        self.bounded = bounded
        functools.update_wrapper(self, handler)

    async def __call__(self, scope, receive, send) -> None:
        gateway: Gateway = scope["state"]["gateway"]
        if gateway.tracer is None or not self.bounded:
            await self.answer(gateway, Call(scope, receive), send)
            return
        from tandem.producers.tracing import answered, serving

        call = Call(scope, receive)
        attributes = {
            "http.request.method": call.method,
            "http.route": self.route,
            "url.path": call.path,
        }
        name = f"{call.method} {self.route}"
        with serving(gateway.tracer, name, call.headers, attributes) as span:
            status, error = await self.answer(gateway, call, send)
            failed = error is not None and status >= 500
            kind = type(error).__name__ if failed else None
            answered(span, {"http.response.status_code": status}, kind, str(error))

    async def answer(self, gateway: Gateway, call: Call, send) -> tuple[int, Exception | None]:
        """Answer the call; its status (499: the caller left), and the error if one."""
        metrics = gateway.metrics
        started = time.perf_counter()
        scope, receive = call.scope, call.receive
        held = False
        error: Exception | None = None
        try:
            if call.method not in self.allowed:
                raise HTTPError(
                    405, f"{call.method} is not allowed on {self.route}; use {self.method}"
                )
            if self.guarded:
                gateway.check_auth(call)
            if self.bounded:
                call.body = await gateway.read_body(call)
                if not gateway.admit("http"):
                    raise HTTPError(503, "too many requests in flight", retry_after_s=1)
                held = True
            response = await self.handler(gateway, call)
        except ClientDisconnect:
            response = None  # nobody reads an answer
        except Exception as e:  # noqa: BLE001 - every error is answered, none ends the server
            error = e
            response = http_error(e).response()
        finally:
            if held:
                gateway.release("http")
        status = 499 if response is None else response.status_code
        if response is not None:
            await response(scope, receive, send)
        metrics.observe("http", self.route, str(status), time.perf_counter() - started)
        return status, error


def endpoint(route: str, *, method: str = "GET", guarded: bool = True, bounded: bool = False):
    """Make a handler an Endpoint (see there)."""
    return lambda handler: Endpoint(handler, route, method, guarded, bounded)
