"""`tandem bench --profile latency`: tandem's own path at low load, against the fewest hops
a queued task with a pushed result can take.

- **bare**: the producer LPUSHes a message; a consumer process blocked in BLMOVE wakes
  and PUBLISHes it on the producer's subscription (one pattern, subscribed once). The
  same Redis, the same redis-py, the same wake-ups, and no tandem.
- **tandem**: `Client.submit` and `get()` on `sim` at zero cost, one worker.

One task at a time, a fixed spacing between tasks, the two paths alternated in blocks
(so both see the same machine), at each spacing. Each task's time runs from just before
its push or submit to its result in the producer's hand; it is split there into the
push (or submit) call and the wait for the result. Redis's own time per command comes
from SLOWLOG, collected over the tandem blocks.
"""

from __future__ import annotations

import multiprocessing
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis

from tandem.broker.settings import Settings
from tandem.producers.client import Client
from tandem.server import RedisServer
from tandem.stack import spawn, stop_process, wait_for_executors
from tandem.tools.load import percentile

MODEL = "sim:1"
SPACINGS_MS = (30.0, 2.0)
BLOCK = 50
TASKS = 300
QUEUE, INFLIGHT, CHANNEL = "bare:queue", "bare:inflight", "bare:result:"


def consume(url: str, ready, stop) -> None:
    """The bare consumer: BLMOVE a message into its in-flight list, PUBLISH it, drop it."""
    client = redis.Redis.from_url(url)
    ready.set()
    while not stop.is_set():
        message = client.blmove(QUEUE, INFLIGHT, 0.2, "RIGHT", "LEFT")
        if message is not None:
            client.publish(CHANNEL + message.decode(), message)
            client.lrem(INFLIGHT, 1, message)
    client.close()


class Bare:
    """The producer's side of the bare path: one subscription, one push per task."""

    def __init__(self, url: str) -> None:
        self.redis = redis.Redis.from_url(url)
        self.pubsub = self.redis.pubsub()
        self.pubsub.psubscribe(CHANNEL + "*")
        reply = self.pubsub.get_message(timeout=5.0)
        if reply is None or reply["type"] != "psubscribe":
            raise RuntimeError(f"Redis did not confirm the bare path's subscription: {reply}")

    def send(self) -> tuple[float, float]:
        """One task: (ms in the push, ms from then to its result)."""
        task = uuid.uuid4().hex
        start = time.perf_counter()
        self.redis.lpush(QUEUE, task)
        pushed = time.perf_counter()
        while True:
            reply = self.pubsub.get_message(timeout=5.0)
            if reply is None:
                raise TimeoutError("the bare consumer did not answer within 5 s")
            if reply["type"] == "pmessage" and reply["channel"] == (CHANNEL + task).encode():
                break
        done = time.perf_counter()
        return (pushed - start) * 1000, (done - pushed) * 1000

    def close(self) -> None:
        self.pubsub.close()
        self.redis.close()


def tandem_send(client: Client) -> tuple[float, float]:
    start = time.perf_counter()
    result = client.submit(MODEL, 1)
    submitted = time.perf_counter()
    result.get(timeout=5.0)
    done = time.perf_counter()
    return (submitted - start) * 1000, (done - submitted) * 1000


def run_latency(
    settings: Settings,
    *,
    spacings_ms: tuple[float, ...] = SPACINGS_MS,
    tasks: int = TASKS,
    block: int = BLOCK,
    progress=None,
) -> dict[str, Any]:
    settings = settings.replace(
        models=(MODEL,), sim_base_ms=0.0, sim_per_item_ms=0.0, max_wait_ms=0.0
    )
    with tempfile.TemporaryDirectory(prefix="tandem-latency-") as folder:
        server = RedisServer(Path(folder) / "redis").start()
        settings = settings.replace(redis_url=server.url, hostname="latency@bench")
        context = multiprocessing.get_context("spawn")
        ready, stop = context.Event(), context.Event()
        consumer = context.Process(target=consume, args=(server.url, ready, stop), daemon=True)
        worker = spawn(["worker"], settings, Path(folder) / "worker.log")
        admin = redis.Redis.from_url(server.url)
        try:
            consumer.start()
            wait_for_executors(admin, 1, 120, [worker])
            if not ready.wait(30):
                raise RuntimeError("the bare consumer did not start within 30 s")
            with Client(settings=settings) as client:
                bare = Bare(server.url)
                try:
                    return _measure(admin, bare, client, spacings_ms, tasks, block, progress)
                finally:
                    bare.close()
        finally:
            stop.set()
            consumer.join(5)
            stop_process(worker, 30)
            admin.close()
            server.stop()


def _measure(admin, bare, client, spacings_ms, tasks, block, progress) -> dict[str, Any]:
    for _ in range(block):  # warm both paths: connections, scripts, the latency model
        bare.send()
        tandem_send(client)
    rows, slow = [], defaultdict(list)
    scripts = {s.sha: name for name, s in vars(client.table.scripts).items() if hasattr(s, "sha")}
    for spacing in spacings_ms:
        if progress:
            progress(f"spacing {spacing:g} ms: {tasks} tasks of each path, blocks of {block}")
        times: dict[str, list[tuple[float, float]]] = {"bare": [], "tandem": []}
        for _ in range(0, tasks, block):
            for name, send in (("bare", bare.send), ("tandem", lambda: tandem_send(client))):
                for _ in range(block):
                    times[name].append(send())
                    time.sleep(spacing / 1000)  # the spacing between tasks: the load itself
        rows.extend(_rows(spacing, times))
    # Redis's own time per command, in one more tandem block of its own (SLOWLOG for every
    # command slows Redis a little, so it runs apart from the blocks measured above).
    admin.config_set("slowlog-max-len", 100_000)
    admin.config_set("slowlog-log-slower-than", 0)
    admin.slowlog_reset()
    for _ in range(block):
        tandem_send(client)
        time.sleep(spacings_ms[0] / 1000)  # the first spacing
    admin.config_set("slowlog-log-slower-than", 10_000)
    _collect(admin, scripts, slow)
    return {"rows": rows, "redis_us": _redis_table(slow)}


def _collect(admin, scripts: dict[str, str], slow: dict[str, list[int]]) -> None:
    for entry in admin.slowlog_get(100_000):
        words = entry["command"].split()
        name = words[0].decode().lower()
        if name == "evalsha" and len(words) > 1:
            name = scripts.get(words[1].decode(), "script")
        elif name in ("config", "slowlog"):
            continue
        slow[name].append(entry["duration"])


def _rows(spacing: float, times: dict[str, list[tuple[float, float]]]) -> list[dict[str, Any]]:
    rows = []
    for name, pairs in times.items():
        total = [a + b for a, b in pairs]
        rows.append(
            {
                "path": name,
                "spacing_ms": spacing,
                "tasks": len(pairs),
                "p50_ms": round(percentile(total, 50), 3),
                "p99_ms": round(percentile(total, 99), 3),
                "send_p50_ms": round(percentile([a for a, _ in pairs], 50), 3),
                "wait_p50_ms": round(percentile([b for _, b in pairs], 50), 3),
            }
        )
    bare, tandem = rows
    for row in rows:
        row["ratio_p50"] = round(row["p50_ms"] / bare["p50_ms"], 2)
        row["ratio_p99"] = round(row["p99_ms"] / bare["p99_ms"], 2)
    tandem["per_task"] = "submit + get()"
    bare["per_task"] = "LPUSH + the PUBLISH received"
    return rows


def _redis_table(slow: dict[str, list[int]]) -> list[dict[str, Any]]:
    """Redis's time per command over the tandem blocks: calls, and p50 in µs."""
    return [
        {"command": name, "calls": len(values), "p50_us": percentile(values, 50)}
        for name, values in sorted(slow.items(), key=lambda kv: -sum(kv[1]))
    ]


COLUMNS = (
    "path",
    "spacing_ms",
    "tasks",
    "p50_ms",
    "p99_ms",
    "ratio_p50",
    "ratio_p99",
    "send_p50_ms",
    "wait_p50_ms",
)

REDIS_COLUMNS = ("command", "calls", "p50_us")
