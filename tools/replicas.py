"""`tandem bench --profile replicas`: what `min_replicas` costs a task at low load.

A primary and one replica on this host, one worker on `sim` at zero cost. The same
producer loop (submit and get(), one task at a time, a fixed spacing) runs against a
worker and Client with min_replicas 0, then 1, alternated in blocks, a fresh worker for
each block. With 1, the submit, the worker's claim and its store each WAIT for the
replica in their own round trip.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from tandem.broker.settings import Settings
from tandem.broker.table import Table
from tandem.producers.client import Client
from tandem.server import RedisServer
from tandem.stack import spawn, stop_process, wait_for_executors
from tandem.tools.harness import Report
from tandem.tools.latency import tandem_send, timing

MODEL = "sim:1"
COLUMNS = ("min_replicas", "tasks", "p50_ms", "p99_ms", "send_p50_ms", "wait_p50_ms")


def run_replicas(
    settings: Settings,
    *,
    tasks: int = 200,
    blocks: int = 2,
    spacing_ms: float = 10.0,
    progress=None,
) -> dict[str, Any]:
    settings = settings.replace(
        models=(MODEL,), sim_base_ms=0.0, sim_per_item_ms=0.0, max_wait_ms=0.0
    )
    times: dict[int, list[tuple[float, float]]] = {0: [], 1: []}
    with tempfile.TemporaryDirectory(prefix="tandem-replicas-") as folder:
        primary = RedisServer(Path(folder) / "primary").start()
        replica = RedisServer(Path(folder) / "replica")
        replica.args = ("--replicaof", "127.0.0.1", str(primary.port))
        replica.start()
        admin = redis.Redis.from_url(primary.url)
        try:
            _wait_for_replica(admin)
            for block in range(blocks):
                for wanted in (0, 1):
                    if progress:
                        progress(f"block {block + 1} of {blocks}: min_replicas {wanted}")
                    chosen = settings.replace(
                        redis_url=primary.url, min_replicas=wanted, hostname=f"r{wanted}@bench"
                    )
                    times[wanted] += _block(chosen, admin, Path(folder), tasks, spacing_ms)
        finally:
            admin.close()
            replica.stop()
            primary.stop()
    return {"spacing_ms": spacing_ms, "rows": [_row(n, pairs) for n, pairs in times.items()]}


def _wait_for_replica(admin: redis.Redis, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while admin.info("replication").get("connected_slaves", 0) < 1:
        if time.monotonic() > deadline:
            raise RuntimeError("the replica did not connect within 30 s")
        time.sleep(0.05)  # polling for the replica, bounded by the deadline


def _block(settings, admin, folder: Path, tasks: int, spacing_ms: float) -> list:
    worker = spawn(["worker"], settings, folder / f"{settings.hostname}.log")
    try:
        wait_for_executors(admin, 1, 120, [worker])  # the last block's left the table
        with Client(settings=settings) as client:
            for _ in range(20):  # warm: connections, scripts, the latency model
                tandem_send(client)
            out = []
            for _ in range(tasks):
                out.append(tandem_send(client))
                time.sleep(spacing_ms / 1000)  # the spacing between tasks: the load itself
            return out
    finally:
        stop_process(worker, 30)
        _wait_gone(admin, settings.hostname)


def _wait_gone(admin: redis.Redis, hostname: str, timeout_s: float = 30.0) -> None:
    """Until the stopped worker's executors have left the table (or the deadline)."""
    deadline = time.monotonic() + timeout_s
    while any(e.worker == hostname for e in Table(admin).executors()):
        if time.monotonic() > deadline:
            return  # its executors lapse by themselves; the next block waits for its own
        time.sleep(0.05)  # polling a condition, bounded by the deadline


def _row(wanted: int, pairs: list[tuple[float, float]]) -> dict[str, Any]:
    return {"min_replicas": wanted, **timing(pairs)}


def report(settings: Settings, *, quick: bool, progress) -> Report:
    data = run_replicas(settings, tasks=100 if quick else 200, progress=progress)
    title = (
        f"tandem bench, profile replicas: submit and get(), one at a time, "
        f"{data['spacing_ms']:g} ms apart, sim at zero cost, a primary and one replica"
    )
    return Report(data).table(title, COLUMNS, data["rows"])
