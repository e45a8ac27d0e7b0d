"""The gRPC side of `tandem bench --profile http`, on tritonclient.grpc: one call at a
time for the low-load rows, and a closed loop of concurrent calls from a process of its
own (tritonclient.grpc.aio) for the gateway's CPU."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess

import numpy as np

MODEL, VERSION = "sim", "1"


def _inputs(module):
    x = module.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.ones((1, 1), np.float32))
    return [x]


def one_call(address: str) -> tuple[Callable[[], object], Callable[[], None]]:
    """(a call of one item, a function that closes its client)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(address)
    inputs = _inputs(grpcclient)
    return lambda: client.infer(MODEL, inputs, model_version=VERSION), client.close


def _closed_loop(address: str, requests: int, concurrency: int, out) -> None:
    import tritonclient.grpc.aio as grpcaio
    from tritonclient.utils import InferenceServerException

    async def main() -> None:
        client = grpcaio.InferenceServerClient(address)
        inputs = _inputs(grpcaio)
        left = iter(range(requests))
        failed = 0

        async def loop() -> None:
            nonlocal failed
            for _ in left:
                try:
                    await client.infer(MODEL, inputs, model_version=VERSION)
                except InferenceServerException:
                    failed += 1

        start = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        out.put((time.perf_counter() - start, failed))
        await client.close()

    asyncio.run(main())


def closed_loop(address: str, requests: int, concurrency: int) -> tuple[float, int]:
    """`requests` calls, `concurrency` at a time, from a process of its own: (seconds,
    failed)."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    process = context.Process(target=_closed_loop, args=(address, requests, concurrency, out))
    process.start()
    try:
        return out.get(timeout=600)
    finally:
        process.join(30)


def _echo_server(port: int, ready) -> None:
    """grpcio's asyncio server with a ModelInfer that echoes its input, on uvloop where
    installed (as the gateway runs): what any service on this stack costs at least."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb2
    from tritonclient.grpc import service_pb2_grpc as pb2_grpc

    class Echo(pb2_grpc.GRPCInferenceServiceServicer):
        async def ModelInfer(self, request, context):
            answer = pb2.ModelInferResponse(model_name=request.model_name, model_version="1")
            answer.outputs.add(name="y", datatype="FP32", shape=[1, 1])
            answer.raw_output_contents.append(request.raw_input_contents[0])
            return answer

    async def serve() -> None:
        server = grpc.aio.server()
        pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Echo(), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    try:
        import uvloop
    except ImportError:
        asyncio.run(serve())
    else:
        uvloop.run(serve())


def start_echo_server() -> tuple[str, BaseProcess]:
    """An echo server (`_echo_server`) in a process of its own: (its address, it)."""
    from tandem.server import free_port

    context = multiprocessing.get_context("spawn")
    port, ready = free_port(), context.Event()
    server = context.Process(target=_echo_server, args=(port, ready), daemon=True)
    server.start()
    if not ready.wait(30):
        server.terminate()
        raise RuntimeError("the echo server did not start within 30 s")
    return f"127.0.0.1:{port}", server
