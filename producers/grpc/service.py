"""The Open Inference Protocol over gRPC: `inference.GRPCInferenceService`, as KServe
and Triton serve it, for tritonclient.grpc and any client of KServe's v2 gRPC.

The messages and the service are those tritonclient.grpc speaks, from its package
(tritonclient's compiled `grpc_service.proto` and `model_config.proto`, BSD-3-Clause):
tandem neither vendors nor compiles protos, so the two cannot drift. The service runs on
grpcio's asyncio server in the gateway's process and event loop, and shares its
Gateway: one AsyncClient, one concurrency bound, one token and one set of metrics.

A request's first dimension is split into tasks and joined back, as over HTTP. The
call's deadline becomes its tasks' deadline, so a call that cannot be answered in time
is refused at once, and a task shed at claim ends the call with DEADLINE_EXCEEDED. A
call cancelled by its client (or past its deadline) revokes its tasks not yet computed.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from tritonclient.grpc import model_config_pb2 as config_pb2
from tritonclient.grpc import service_pb2 as pb2
from tritonclient.grpc import service_pb2_grpc as pb2_grpc

from tandem.broker.errors import (
    BrokerUnavailable,
    DeadlineExceeded,
    Overloaded,
    QueueFull,
)
from tandem.producers.grpc.tensors import raw_output, read_request
from tandem.producers.http import oip
from tandem.producers.http.gateway import Gateway, HTTPError, http_error
from tandem.producers.http.tensors import FROM_DTYPE

Code = grpc.StatusCode
#: An HTTP status of the gateway's errors -> the gRPC code a client of Triton expects.
CODES = {
    400: Code.INVALID_ARGUMENT,
    401: Code.UNAUTHENTICATED,
    404: Code.NOT_FOUND,
    408: Code.DEADLINE_EXCEEDED,
    413: Code.RESOURCE_EXHAUSTED,
    503: Code.UNAVAILABLE,
    504: Code.DEADLINE_EXCEEDED,
}
#: The service's full name, as its methods' paths and spans name it.
SERVICE = "inference.GRPCInferenceService"
#: The codes that mark a server span an error, as OpenTelemetry's conventions for gRPC
#: servers list them: the server's faults and its refusals (UNAVAILABLE, as Overloaded).
SERVER_FAULTS = {
    Code.UNKNOWN, Code.DEADLINE_EXCEEDED, Code.UNIMPLEMENTED, Code.INTERNAL,
    Code.UNAVAILABLE, Code.DATA_LOSS,
}  # fmt: skip
#: The trailer gRPC's retry policy reads as the server's pushback (gRFC A6).
PUSHBACK = "grpc-retry-pushback-ms"


class Busy(Exception):
    """Past the gateway's concurrency bound."""


class Failed(Exception):
    """A call's error as its gRPC status, and the seconds to wait before a retry."""

    def __init__(self, code: grpc.StatusCode, text: str, retry_s: float | None) -> None:
        super().__init__(text)
        self.code, self.text, self.retry_s = code, text, retry_s


def grpc_status(e: Exception) -> tuple[grpc.StatusCode, str, float | None]:
    """tandem's error as a gRPC status: its code, its message, and the seconds to wait
    before trying again where that is known."""
    if isinstance(e, Busy):
        return Code.RESOURCE_EXHAUSTED, "too many requests in flight", 1.0
    if isinstance(e, Overloaded):
        if math.isinf(e.wait_s):  # no live executor: look again soon
            return Code.UNAVAILABLE, str(e), 1.0
        return Code.RESOURCE_EXHAUSTED, str(e), max(e.wait_s - e.deadline_s, 0.001)
    if isinstance(e, QueueFull):
        return Code.RESOURCE_EXHAUSTED, str(e), 1.0
    if isinstance(e, BrokerUnavailable):
        return Code.UNAVAILABLE, str(e), 1.0
    if isinstance(e, DeadlineExceeded):
        return Code.DEADLINE_EXCEEDED, str(e), None
    error = http_error(e)
    return CODES.get(error.status, Code.INTERNAL), str(error), error.retry_after_s


class Service(pb2_grpc.GRPCInferenceServiceServicer):
    """Health, metadata, config and infer (unary and streamed); the rest of Triton's
    extensions (repository, shared memory, statistics, trace, logging) answer
    UNIMPLEMENTED with the reason (see `_unimplemented`)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def _serve(
        self,
        method: str,
        context: grpc.aio.ServicerContext,
        work: Callable[[], Awaitable[Any]],
        *,
        guarded: bool = True,
        bounded: bool = False,
    ) -> Any:
        """One unary call (see `_run`); an error ends it with its status."""
        try:
            return await self._run(method, context, work, guarded=guarded, bounded=bounded)
        except Failed as e:
            if e.retry_s is not None:
                context.set_trailing_metadata(((PUSHBACK, str(math.ceil(e.retry_s * 1000))),))
            await context.abort(e.code, e.text)

    async def _run(
        self,
        method: str,
        context: grpc.aio.ServicerContext,
        work: Callable[[], Awaitable[Any]],
        *,
        guarded: bool = True,
        bounded: bool = False,
    ) -> Any:
        """Run one call's work (see `_answer`), an inference call in a server span when
        this process traces."""
        tracer = self.gateway.tracer
        if tracer is None or not bounded:
            return await self._answer(method, context, work, guarded=guarded, bounded=bounded)
        from tandem.producers.tracing import answered, serving

        carrier = dict(context.invocation_metadata() or ())
        attributes = {"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": method}
        with serving(tracer, f"{SERVICE}/{method}", carrier, attributes) as span:
            try:
                result = await self._answer(method, context, work, guarded=guarded, bounded=True)
            except Failed as e:
                kind = e.code.name if e.code in SERVER_FAULTS else None
                answered(span, {"rpc.grpc.status_code": e.code.value[0]}, kind, e.text)
                raise
            except asyncio.CancelledError:
                answered(span, {"rpc.grpc.status_code": Code.CANCELLED.value[0]})
                raise
            answered(span, {"rpc.grpc.status_code": Code.OK.value[0]})
            return result

    async def _answer(
        self,
        method: str,
        context: grpc.aio.ServicerContext,
        work: Callable[[], Awaitable[Any]],
        *,
        guarded: bool = True,
        bounded: bool = False,
    ) -> Any:
        """Run one call's work: auth unless unguarded, the concurrency bound for a
        bounded one, its metrics; every error raised as Failed, with its gRPC status."""
        gateway = self.gateway
        started = time.perf_counter()
        code, held = Code.OK, False
        try:
            if guarded:
                self._check_auth(context)
            if bounded:
                if not gateway.admit("grpc"):
                    raise Busy
                held = True
            return await work()
        except asyncio.CancelledError:
            code = Code.CANCELLED
            raise
        except Exception as e:  # noqa: BLE001 - every error is answered, none ends the server
            code, text, retry_s = grpc_status(e)
            raise Failed(code, text, retry_s) from None
        finally:
            if held:
                gateway.release("grpc")
            gateway.metrics.observe("grpc", method, code.name, time.perf_counter() - started)

    def _check_auth(self, context: grpc.aio.ServicerContext) -> None:
        token = self.gateway.token
        if not token:
            return
        metadata = dict(context.invocation_metadata() or ())
        scheme, _, value = str(metadata.get("authorization", "")).partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            value.strip().encode(), token.encode()
        ):
            raise HTTPError(401, "a valid 'authorization: Bearer <token>' metadata is required")

    # Health and metadata

    async def ServerLive(self, request, context):
        return await self._serve("ServerLive", context, self._live, guarded=False)

    async def _live(self) -> Any:
        return pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return await self._serve("ServerReady", context, self._ready, guarded=False)

    async def _ready(self) -> Any:
        return pb2.ServerReadyResponse(ready=await self.gateway.not_ready() is None)

    async def ModelReady(self, request, context):
        async def work() -> Any:
            model, _ = await oip.find_model(self.gateway, request.name, request.version or None)
            return pb2.ModelReadyResponse(ready=await self.gateway.client.live(model))

        return await self._serve("ModelReady", context, work)

    async def ServerMetadata(self, request, context):
        async def work() -> Any:
            return pb2.ServerMetadataResponse(name="tandem", version=oip.server_version())

        return await self._serve("ServerMetadata", context, work)

    async def ModelMetadata(self, request, context):
        async def work() -> Any:
            model, spec = await oip.find_model(self.gateway, request.name, request.version or None)
            name, _, version = model.partition(":")

            def rows(kind: str) -> list:
                return [
                    pb2.ModelMetadataResponse.TensorMetadata(
                        name=r["name"], datatype=FROM_DTYPE[r["dtype"]], shape=[-1, *r["shape"]]
                    )
                    for r in spec[kind]
                ]

            return pb2.ModelMetadataResponse(
                name=name,
                versions=[version],
                platform="tandem",
                inputs=rows("inputs"),
                outputs=rows("outputs"),
            )

        return await self._serve("ModelMetadata", context, work)

    async def ModelConfig(self, request, context):
        async def work() -> Any:
            model, spec = await oip.find_model(self.gateway, request.name, request.version or None)

            def kind(r: dict) -> int:
                datatype = FROM_DTYPE[r["dtype"]].replace("BYTES", "STRING")
                return config_pb2.DataType.Value("TYPE_" + datatype)

            inputs = [
                config_pb2.ModelInput(name=r["name"], data_type=kind(r), dims=r["shape"])
                for r in spec["inputs"]
            ]
            outputs = [
                config_pb2.ModelOutput(name=r["name"], data_type=kind(r), dims=r["shape"])
                for r in spec["outputs"]
            ]
            config = config_pb2.ModelConfig(
                name=model.partition(":")[0],
                platform="tandem",
                max_batch_size=spec["max_batch_size"],
                input=inputs,
                output=outputs,
            )
            return pb2.ModelConfigResponse(config=config)

        return await self._serve("ModelConfig", context, work)

    # Inference

    async def ModelInfer(self, request, context):
        return await self._serve(
            "ModelInfer", context, lambda: self._infer(request, context), bounded=True
        )

    async def _infer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        gateway = self.gateway
        version = request.model_version or None
        model, spec = await oip.find_model(gateway, request.model_name, version)
        parsed = read_request(request)
        items, binary = oip.split(parsed, spec, gateway.limits.max_items)
        priority, deadline_s = oip.parameters(parsed.parameters)
        left = context.time_remaining()
        if left is not None:  # the call's deadline, or Triton's timeout if that is sooner
            deadline_s = left if deadline_s is None else min(deadline_s, left)
        results = await oip.run(
            gateway, model, spec, items, priority, deadline_s, binary, protocol="grpc"
        )
        name, _, version = model.partition(":")
        response = pb2.ModelInferResponse(model_name=name, model_version=version, id=request.id)
        for output, datatype, array, _ in oip.joined(spec, parsed, results):
            response.outputs.add(name=output, datatype=datatype, shape=array.shape)
            response.raw_output_contents.append(raw_output(datatype, array))
        return response

    async def ModelStreamInfer(self, request_iterator, context) -> AsyncIterator[Any]:
        """Each request of the stream inferred as it comes, its response (or its error,
        as Triton sends it: `error_message`) sent as soon as it is ready."""
        try:
            self._check_auth(context)
        except HTTPError as e:
            await context.abort(Code.UNAUTHENTICATED, str(e))
        answers: asyncio.Queue = asyncio.Queue()
        pending: set[asyncio.Task] = set()

        async def one(request: Any) -> None:
            try:
                response = await self._run(
                    "ModelStreamInfer",
                    context,
                    lambda: self._infer(request, context),
                    guarded=False,
                    bounded=True,
                )
                await answers.put(pb2.ModelStreamInferResponse(infer_response=response))
            except Failed as e:  # this request's error; the stream goes on
                failed = pb2.ModelInferResponse(id=request.id, model_name=request.model_name)
                await answers.put(
                    pb2.ModelStreamInferResponse(error_message=e.text, infer_response=failed)
                )

        async def read() -> None:
            async for request in request_iterator:
                task = asyncio.create_task(one(request))
                pending.add(task)
                task.add_done_callback(pending.discard)
            while pending:
                await asyncio.gather(*list(pending))
            await answers.put(None)

        reader = asyncio.create_task(read())
        try:
            while (answer := await answers.get()) is not None:
                yield answer
        finally:
            reader.cancel()
            for task in list(pending):
                task.cancel()


def _unimplemented(name: str):
    async def method(self, request, context):
        await context.abort(
            Code.UNIMPLEMENTED,
            f"{name} is a Triton extension tandem does not serve: models are loaded by the "
            "workers that serve them, and statistics are on the HTTP port's /metrics",
        )

    method.__name__ = name
    return method


for _method in pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
    if _method.name not in vars(Service):
        setattr(Service, _method.name, _unimplemented(_method.name))
