"""`tandem bench --profile http`: the gateway, over HTTP and gRPC, against a direct
`Client`, in one run.

- **added at low load**: one task at a time on `sim` at zero cost, one worker; a direct
  `Client.submit` + `get()`, an OIP infer POST through the gateway (keep-alive), and a
  gRPC ModelInfer call (tritonclient.grpc), alternated in blocks, at 30 ms and 2 ms
  spacing. A path's p50 minus the direct p50 is what the gateway adds. Beside them, the
  same gRPC call to an echo server of grpcio's own: a gRPC round trip doing nothing.
- **gateway CPU and requests/s**: a closed loop of concurrent OIP requests (one item
  each) from Locust's FastHttpUser in a process of its own (tools/locustfile.py), on the
  same zero-cost model, and the same over gRPC from tritonclient.grpc.aio; the gateway's
  own CPU time (user + system, through psutil) per request, and requests/s served. The
  gRPC loop runs again on an echo server of grpcio's own: the floor of any gateway on
  grpcio's asyncio server.
- **the sim sweep through HTTP**: sim (20 ms + 0.5 ms a task, 2 workers) under Poisson
  arrivals, each an HTTP request sent open-loop by aiohttp and timed to its response,
  next to the direct `tandem` row of the ordinary sweep at the same rates.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from tandem.broker.settings import Settings
from tandem.tools import bench, grpcload
from tandem.tools.harness import (
    SYSTEMS,
    Point,
    Report,
    alternate,
    arrivals,
    percentile,
    point_folder,
)

MODEL = "sim:1"
JSON = {"Content-Type": "application/json"}
TANDEM = SYSTEMS["tandem"]
PATH = "/v2/models/sim/versions/1/infer"
SPACINGS_MS = (30.0, 2.0)
BLOCK = 50
TASKS = 300
CONCURRENCIES = (1, 16, 64)
BURST = 4000
SWEEP_RATES = (10.0, 300.0, 1000.0)


def body(n: int) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [n]}]}
    ).encode()


class Keepalive:
    """One keep-alive connection (the standard library's client): the low-load rows time
    what the gateway adds, not what a heavier client library costs."""

    def __init__(self, url: str) -> None:
        self.connection = http.client.HTTPConnection(url.removeprefix("http://"))

    def post(self, path: str, payload: bytes) -> bytes:
        self.connection.request("POST", path, payload, {"Content-Type": "application/json"})
        response = self.connection.getresponse()
        answer = response.read()
        if response.status != 200:
            raise RuntimeError(f"the gateway answered {response.status}: {answer[:200]!r}")
        return answer

    def close(self) -> None:
        self.connection.close()


def _low_load(point: Point, spacings_ms, tasks: int, block: int, progress) -> list[dict]:
    http = Keepalive(point.http_url)
    client = point.client
    assert client is not None  # a tandem point

    def timed(send) -> Callable[[], float]:
        def once() -> float:
            start = time.perf_counter()
            send()
            return (time.perf_counter() - start) * 1000

        return once

    call, close = grpcload.one_call(point.grpc_address)
    echo, server = grpcload.start_echo_server()
    echo_call, echo_close = grpcload.one_call(echo)
    paths = {
        "direct": timed(lambda: client.submit(MODEL, [1.0]).get(timeout=5)),
        "http": timed(lambda: http.post(PATH, body(1))),
        "grpc": timed(call),
        # tritonclient.grpc to grpcio's own echo server: a gRPC round trip doing nothing
        "grpc floor": timed(echo_call),
    }
    rows = []
    try:
        for spacing, times in alternate(paths, spacings_ms, tasks, block, progress).items():
            p50 = {k: percentile(v, 50) for k, v in times.items()}
            rows += [
                {
                    "path": name,
                    "spacing_ms": spacing,
                    "requests": len(values),
                    "p50_ms": round(p50[name], 3),
                    "p99_ms": round(percentile(values, 99), 3),
                    "added_p50_ms": round(p50[name] - p50["direct"], 3),
                }
                for name, values in times.items()
            ]
    finally:
        http.close()
        close()
        echo_close()
        server.terminate()
        server.join(10)
    return rows


def _cpu(point: Point, protocol: str, requests: int, concurrency: int, progress) -> dict:
    """A closed loop on the gateway: Locust's users (tools/locustfile.py) over HTTP, or
    tritonclient.grpc.aio over gRPC; requests/s, and the gateway's own CPU per request."""
    progress(f"gateway CPU, {protocol}: {requests} requests, {concurrency} at a time")
    assert point.gateway is not None  # a point with the gateway
    process = psutil.Process(point.gateway.pid)
    if protocol == "http":
        _locust(point.http_url, 300, concurrency)  # warm
        before = process.cpu_times()
        stats = _locust(point.http_url, requests, concurrency)
        seconds = stats["last_request_timestamp"] - stats["start_time"]
        sent, failed = stats["num_requests"], stats["num_failures"]
    else:
        grpcload.closed_loop(point.grpc_address, 300, concurrency)  # warm
        before = process.cpu_times()
        seconds, failed = grpcload.closed_loop(point.grpc_address, requests, concurrency)
        sent = requests
    cpu_s = _cpu_s(process.cpu_times(), before)
    return _cpu_row(protocol, sent, concurrency, failed, seconds, cpu_s)


def _grpc_floor(requests: int, concurrency: int) -> dict[str, Any]:
    """The gRPC closed loop on an echo server of grpcio's own: its CPU per request, the
    floor of a gRPC gateway on grpcio's asyncio server."""
    address, server = grpcload.start_echo_server()
    try:
        grpcload.closed_loop(address, 300, concurrency)  # warm
        process = psutil.Process(server.pid)
        before = process.cpu_times()
        seconds, failed = grpcload.closed_loop(address, requests, concurrency)
        after = process.cpu_times()
    finally:
        server.terminate()
        server.join(10)
    return _cpu_row("grpc floor", requests, concurrency, failed, seconds, _cpu_s(after, before))


def _cpu_s(after, before) -> float:
    """User and system CPU seconds between two of psutil's cpu_times."""
    return (after.user - before.user) + (after.system - before.system)


def _cpu_row(
    protocol: str, requests: int, concurrency: int, failed: int, seconds: float, cpu_s: float
) -> dict[str, Any]:
    return {
        "protocol": protocol,
        "requests": requests,
        "concurrency": concurrency,
        "failed": failed,
        "requests_per_s": round(requests / seconds, 1),
        "gateway_cpu_us_per_request": round(cpu_s / requests * 1e6, 1),
        "gateway_cpu_share": round(cpu_s / seconds, 2),
    }


def _locust(url: str, requests: int, users: int) -> dict[str, Any]:
    """Run Locust headless until `requests` are answered; its stats of the infer path."""
    args = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(Path(__file__).with_name("locustfile.py")),
        "--headless",
        "--only-summary",
        "--json",
        f"--users={users}",
        f"--spawn-rate={users}",
        "--run-time=600",
        f"--host={url}",
    ]
    env = {**os.environ, "TANDEM_BENCH_REQUESTS": str(requests), "TANDEM_BENCH_PATH": PATH}
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=660)
    if done.returncode not in (0, 1):  # 1: some requests failed, counted in the stats
        raise RuntimeError(f"locust exited {done.returncode}: {done.stderr[-2000:]}")
    (stats,) = [row for row in json.loads(done.stdout) if row["name"] == PATH]
    return stats


async def _open_loop(url: str, schedule: list[float]) -> tuple[list[float], Counter]:
    """Each arrival an OIP request at its time (open loop), on aiohttp's pool of
    keep-alive connections; its latency from its due time to its response. Returns the
    latencies of those answered 200, and the others counted by status or error."""
    import aiohttp

    latencies: list[float] = []
    failed: Counter = Counter()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(url, connector=connector) as session:

        async def one(n: int, due: float) -> None:
            try:
                async with session.post(PATH, data=body(n), headers=JSON) as response:
                    await response.read()
                    status = response.status
            except (aiohttp.ClientError, OSError) as e:
                failed[type(e).__name__] += 1
                return
            if status == 200:
                latencies.append((time.perf_counter() - due) * 1000)
            else:
                failed[str(status)] += 1

        tasks = []
        start = time.perf_counter()
        for n, offset in enumerate(schedule):
            wait = start + offset - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)  # pacing the open-loop arrivals
            tasks.append(asyncio.create_task(one(n, start + offset)))
        await asyncio.gather(*tasks)
    return latencies, failed


def _sweep(settings: Settings, rates, seconds: float, workers: int, progress) -> list[dict]:
    rows = []
    sim = settings.replace(models=(MODEL,), sim_base_ms=20.0, sim_per_item_ms=0.5)
    for rate in rates:
        progress(f"sim sweep at {rate:g} req/s: direct tandem, then through HTTP")
        direct = bench.run_point(TANDEM, sim, rate, seconds, workers=workers, drain_s=5.0)
        rows.append(
            {
                "path": "direct",
                "offered_rps": rate,
                "p50_ms": direct["p50_ms"],
                "p99_ms": direct["p99_ms"],
                "failed": direct["failed"],
            }
        )
        with point_folder("tandem-http-", f"http sweep at {rate:g}/s") as folder:
            point = Point(TANDEM, sim, workers, folder, gateway=True)
            try:
                asyncio.run(_open_loop(point.http_url, [i * 0.01 for i in range(50)]))  # warm
                schedule = arrivals(rate, seconds, seed=1)
                latencies, failed = asyncio.run(_open_loop(point.http_url, schedule))
            finally:
                point.close()
        rows.append(
            {
                "path": "http",
                "offered_rps": rate,
                "p50_ms": round(percentile(latencies, 50), 2),
                "p99_ms": round(percentile(latencies, 99), 2),
                "failed": sum(failed.values()),
                "failures": dict(failed),
            }
        )
    return rows


def run_http(
    settings: Settings,
    *,
    quick: bool = False,
    workers: int = 2,
    progress: Callable[[str], None] = print,
    spacings_ms: tuple[float, ...] = SPACINGS_MS,
    block: int = BLOCK,
    concurrencies: tuple[int, ...] = CONCURRENCIES,
    tasks: int | None = None,
    burst: int | None = None,
    rates: tuple[float, ...] | None = None,
    seconds: float | None = None,
) -> dict[str, Any]:
    zero = settings.replace(models=(MODEL,), sim_base_ms=0.0, sim_per_item_ms=0.0)
    tasks = tasks or (100 if quick else TASKS)
    burst = burst or (1000 if quick else BURST)
    with point_folder("tandem-http-", "http profile") as folder:
        point = Point(TANDEM, zero, 1, folder, gateway=True)
        try:
            low = _low_load(point, spacings_ms, tasks, block, progress)
            cpu = [
                _cpu(point, protocol, burst, c, progress)
                for protocol in ("http", "grpc")
                for c in concurrencies
            ]
        finally:
            point.close()
    progress("gRPC's floor: the same closed loop on an echo server of grpcio's own")
    cpu += [_grpc_floor(burst, c) for c in concurrencies]
    rates = rates or ((10.0, 300.0) if quick else SWEEP_RATES)
    seconds = seconds or (2.0 if quick else 5.0)
    sweep = _sweep(settings, rates, seconds, workers, progress)
    return {"low_load": low, "cpu": cpu, "sweep": sweep}


LOW_COLUMNS = ("path", "spacing_ms", "requests", "p50_ms", "p99_ms", "added_p50_ms")
CPU_COLUMNS = (
    "protocol",
    "requests",
    "concurrency",
    "failed",
    "requests_per_s",
    "gateway_cpu_us_per_request",
    "gateway_cpu_share",
)
SWEEP_COLUMNS = ("path", "offered_rps", "p50_ms", "p99_ms", "failed")


def report(settings: Settings, *, quick: bool, workers: int, progress) -> Report:
    data = run_http(settings, quick=quick, workers=workers, progress=progress)
    out = Report(data)
    out.table(
        "tandem bench, profile http: one request at a time (direct, HTTP, gRPC), sim at zero "
        "cost, one worker",
        LOW_COLUMNS,
        data["low_load"],
    )
    out.table("the gateway's CPU, a closed loop", CPU_COLUMNS, data["cpu"])
    return out.table(
        f"the sim sweep, {workers} workers: direct Client and through HTTP",
        SWEEP_COLUMNS,
        data["sweep"],
    )
