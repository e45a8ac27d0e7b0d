"""The gRPC side of `tandem bench --profile http`, on tritonclient.grpc: one call at a
time for the low-load rows, and a closed loop of concurrent calls from a process of its
own (tritonclient.grpc.aio) for the gateway's CPU."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Callable

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
