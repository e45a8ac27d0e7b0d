"""`tandem bench --profile latency`: tandem's own path at low load, against the fewest hops
a queued task with a pushed result can take.

- **bare**: the producer LPUSHes a message; a consumer process blocked in BLMOVE wakes
  and PUBLISHes it on the producer's subscription (one pattern, subscribed once). The
  same Redis, the same redis-py, the same wake-ups, and no tandem.
- **floor**: the least a path with tandem's constraints can cost: an atomic route
  script (the first of a ready set, else L1), tandem's own message encoding and decoding,
  a Celery result stored and published by one script that also drops the task from
  in-flight, its Redis calls made as tandem's are (broker/direct.py, on connections
  made as tandem makes them, broker/connect.py). No executor
  states, checks, metrics, events or threads: what tandem adds over the floor is its
  machinery, what the floor adds over bare is the constraints. Bare goes through
  redis-py's client as it comes (RESP3 in redis-py 8), as the issue that asked for it
  defined it.
- **tandem**: `Client.submit` and `get()` on `sim` at zero cost, one worker.

The hop table puts the floor's steps next to tandem's: the same steps, noted by its
producer and its consumer as tandem's are by a producer and a worker.

One task at a time, a fixed spacing between tasks, the two paths alternated in blocks
(so both see the same machine), at each spacing. Each task's time runs from just before
its push or submit to its result in the producer's hand; it is split there into the
push (or submit) call and the wait for the result. Redis's own time per command comes
from SLOWLOG, collected over the tandem blocks; the hop table (tools/hops.py) from the
steps a producer and a worker of its own note as they pass them.
"""

from __future__ import annotations

import json
import multiprocessing
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis

from tandem.broker import keys, message, results
from tandem.broker.connect import connect
from tandem.broker.direct import DirectCalls
from tandem.broker.faults import step_line, write_steps
from tandem.broker.settings import Settings
from tandem.producers.client import Client
from tandem.tools import hops
from tandem.tools.harness import SYSTEMS, Point, Report, alternate, percentile, point_folder

MODEL = "sim:1"
SPACINGS_MS = (30.0, 2.0)
BLOCK = 50
TASKS = 300
QUEUE, INFLIGHT, CHANNEL = "bare:queue", "bare:inflight", "bare:result:"
#: The floor's keys: its ready set (one consumer in it), its L1, its consumer's L2 and
#: in-flight; its task ids begin with FLOOR_TOKEN, so one pattern hears their results.
FLOOR_READY, FLOOR_L1 = "floor:ready", "floor:l1"
FLOOR_L2, FLOOR_INFLIGHT = "floor:l2", "floor:inflight"
FLOOR_TOKEN = "f100f100"
FLOOR_ROUTE = """
local top = redis.call('ZRANGE', KEYS[1], 0, 0)
if #top == 0 then redis.call('LPUSH', KEYS[2], ARGV[1]) return 0 end
redis.call('LPUSH', KEYS[3], ARGV[1])
return top[1]
"""
FLOOR_COMPLETE = """
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
redis.call('PUBLISH', KEYS[1], ARGV[1])
redis.call('LREM', KEYS[2], -1, ARGV[2])
return 1
"""


def consume(url: str, ready, stop) -> None:
    """The bare consumer: BLMOVE a message into its in-flight list, PUBLISH it, drop it."""
    client = redis.Redis.from_url(url)
    ready.set()
    while not stop.is_set():
        # redis-py types the timeout as int; Redis takes seconds with decimals.
        found: bytes | None = client.blmove(QUEUE, INFLIGHT, 0.2, "RIGHT", "LEFT")  # type: ignore[arg-type,assignment]
        if found is not None:
            client.publish(CHANNEL + found.decode(), found)
            client.lrem(INFLIGHT, 1, found)  # type: ignore[arg-type]
    client.close()


def consume_floor(url: str, ready, stop, dump, trace: str) -> None:
    """The floor's consumer: BLMOVE a message into in-flight, decode it, and store and
    publish its Celery result (its input, as `sim` returns it) in one script. It notes
    its steps as a tandem worker does (broker/faults.py, read by tools/hops.py), and
    writes them out to the trace folder once `dump` is set, clearing it."""
    client = connect(url)
    direct = DirectCalls(client)
    complete = client.register_script(FLOOR_COMPLETE)
    noted: list[str] = []
    ready.set()
    while not stop.is_set():
        raw = direct.command("BLMOVE", FLOOR_L2, FLOOR_INFLIGHT, "RIGHT", "LEFT", 0.2)
        if raw is not None:
            taken = time.monotonic_ns()
            task = message.decode(raw, max_bytes=1 << 20)
            assert task.id is not None  # the floor's producer gives every task an id
            meta = results.success(task.id, task.inputs)
            stored = [keys.result(task.id), FLOOR_INFLIGHT]
            sending = time.monotonic_ns()
            direct.script(complete, stored, [meta, raw, 3600])
            done = time.monotonic_ns()
            noted += [
                step_line(taken, "wait_l2", "after"),
                step_line(sending, "complete", "before"),
                step_line(done, "complete", "after"),
            ]
        if dump.is_set():
            write_steps(Path(trace), noted)
            noted.clear()
            dump.clear()
    direct.close()
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


class Floor(Bare):
    """The producer's side of the floor: encode, route by script, wait on one pattern."""

    def __init__(self, url: str) -> None:
        self.redis = connect(url)
        self.redis.zadd(FLOOR_READY, {"floor-consumer": 1})
        self.route = self.redis.register_script(FLOOR_ROUTE)
        self.direct = DirectCalls(self.redis)
        self.pubsub = self.redis.pubsub()
        self.pubsub.psubscribe(f"{keys.RESULT_PREFIX}{FLOOR_TOKEN}-*")
        reply = self.pubsub.get_message(timeout=5.0)
        if reply is None or reply["type"] != "psubscribe":
            raise RuntimeError(f"Redis did not confirm the floor's subscription: {reply}")

    def close(self) -> None:
        self.direct.close()
        super().close()

    def send(self, noted: list | None = None) -> tuple[float, float]:
        """One task: (ms to its route's reply, ms from then to its result). noted: gets
        (start, route sent, route's reply, result) in monotonic ns, for the hop table."""
        task_id = FLOOR_TOKEN + str(uuid.uuid4())[8:]
        channel = keys.result(task_id).encode()
        start = time.monotonic_ns()
        envelope = message.encode_checked(
            MODEL,
            1,
            queue=keys.l1(MODEL),
            task_id=task_id,
            priority=0,
            expires=None,
            binary=False,
            limit=1 << 20,
        )
        routing = time.monotonic_ns()
        if self.direct.script(self.route, [FLOOR_READY, FLOOR_L1, FLOOR_L2], [envelope]) == 0:
            raise RuntimeError("the floor's route found no consumer in its ready set")
        sent = time.monotonic_ns()
        while True:
            reply = self.pubsub.get_message(timeout=5.0)
            if reply is None:
                raise TimeoutError("the floor's consumer did not answer within 5 s")
            if reply["type"] == "pmessage" and reply["channel"] == channel:
                json.loads(reply["data"])
                break
        done = time.monotonic_ns()
        if noted is not None:
            noted.append((start, routing, sent, done))
        return (sent - start) / 1e6, (done - sent) / 1e6


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
    progress=lambda text: None,
) -> dict[str, Any]:
    settings = settings.replace(
        models=(MODEL,), sim_base_ms=0.0, sim_per_item_ms=0.0, max_wait_ms=0.0
    )
    with point_folder("tandem-latency-", "latency profile") as folder:
        point = Point(SYSTEMS["tandem"], settings, 1, folder)
        context = multiprocessing.get_context("spawn")
        ready, stop = context.Event(), context.Event()
        floor_ready, dump = context.Event(), context.Event()
        trace = folder / "floor-steps"
        trace.mkdir()
        consumers = [
            context.Process(target=consume, args=(point.url, ready, stop), daemon=True),
            context.Process(
                target=consume_floor,
                args=(point.url, floor_ready, stop, dump, str(trace)),
                daemon=True,
            ),
        ]
        try:
            for consumer in consumers:
                consumer.start()
            if not (ready.wait(30) and floor_ready.wait(30)):
                raise RuntimeError("the bare and floor consumers did not start within 30 s")
            client = point.client
            assert client is not None  # a tandem point
            bare, floor = Bare(point.url), Floor(point.url)
            try:
                report = _measure(
                    point.redis, bare, floor, client, spacings_ms, tasks, block, progress
                )
                progress(
                    f"hops: {block} tasks of the floor and of tandem at "
                    f"{spacings_ms[0]:g} ms, each noting its steps"
                )
                floor_hops = hops.measure_floor_hops(
                    floor.send,
                    dump,
                    trace,
                    consumers[1],
                    tasks=block,
                    spacing_ms=spacings_ms[0],
                )
            finally:
                bare.close()
                floor.close()
            point.stop_workers()  # the hops get a worker of their own
            tandem_hops = hops.measure_hops(
                client,
                point.settings.replace(hostname="hops@bench"),
                folder,
                point.redis,
                MODEL,
                tasks=block,
                spacing_ms=spacings_ms[0],
            )
            report["hops"] = hops.side_by_side(tandem_hops, floor_hops)
            return report
        finally:
            stop.set()
            for consumer in consumers:
                consumer.join(5)
            point.close()


def _measure(admin, bare, floor, client, spacings_ms, tasks, block, progress) -> dict[str, Any]:
    paths = {"bare": bare.send, "floor": floor.send, "tandem": lambda: tandem_send(client)}
    scripts = {s.sha: name for name, s in vars(client.table.scripts).items() if hasattr(s, "sha")}
    timed = alternate(paths, spacings_ms, tasks, block, progress)
    rows = [row for spacing, times in timed.items() for row in _rows(spacing, times)]
    # Redis's own time per command, in one more tandem block of its own (SLOWLOG for every
    # command slows Redis a little, so it runs apart from the blocks measured above).
    admin.config_set("slowlog-max-len", 100_000)
    admin.config_set("slowlog-log-slower-than", 0)
    admin.slowlog_reset()
    for _ in range(block):
        tandem_send(client)
        time.sleep(spacings_ms[0] / 1000)  # the first spacing
    admin.config_set("slowlog-log-slower-than", 10_000)
    slow: dict[str, list[int]] = defaultdict(list)
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
        rows.append({"path": name, "spacing_ms": spacing, **timing(pairs)})
    bare, floor, tandem = rows
    for row in rows:
        row["ratio_p50"] = round(row["p50_ms"] / bare["p50_ms"], 2)
        row["ratio_p99"] = round(row["p99_ms"] / bare["p99_ms"], 2)
        row["over_floor_p50"] = round(row["p50_ms"] / floor["p50_ms"], 2)
    tandem["per_task"] = "submit + get()"
    floor["per_task"] = "encode + route script + the stored result received"
    bare["per_task"] = "LPUSH + the PUBLISH received"
    return rows


def timing(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    """Tasks timed as (send ms, wait ms): their count, total p50 and p99, and the p50 of
    each part."""
    total = [a + b for a, b in pairs]
    return {
        "tasks": len(pairs),
        "p50_ms": round(percentile(total, 50), 3),
        "p99_ms": round(percentile(total, 99), 3),
        "send_p50_ms": round(percentile([a for a, _ in pairs], 50), 3),
        "wait_p50_ms": round(percentile([b for _, b in pairs], 50), 3),
    }


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
    "over_floor_p50",
    "send_p50_ms",
    "wait_p50_ms",
)

REDIS_COLUMNS = ("command", "calls", "p50_us")


def report(settings: Settings, *, quick: bool, progress) -> Report:
    data = run_latency(settings, tasks=100 if quick else TASKS, progress=progress)
    out = Report(data)
    out.table(
        "tandem bench, profile latency: one task at a time, sim at zero cost, one worker",
        COLUMNS,
        data["rows"],
    )
    out.line("send = LPUSH or submit(); wait = from then to the result in hand; ratio = over bare.")
    out.table("Redis's own time per command, tandem blocks", REDIS_COLUMNS, data["redis_us"])
    return out.table(
        "Where one task's time goes: ms from the call to submit, medians "
        "(tandem, and the floor's same step)",
        hops.COLUMNS,
        data["hops"],
    )
