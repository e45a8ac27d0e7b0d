"""Open-loop Poisson load and its measurements: latency, route mix, batch size."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from tandem.broker import keys
from tandem.producers.client import Client


class ResultWatcher:
    """Records when each result is published, from Celery's result channels."""

    def __init__(self, client: Client | redis.Redis) -> None:
        connection = client.redis if isinstance(client, Client) else client
        self.pubsub = connection.pubsub(ignore_subscribe_messages=True)
        self.pubsub.psubscribe(keys.RESULT_PREFIX + "*")
        self.arrived: dict[str, tuple[float, str]] = {}
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="result watcher", daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        while not self._stop.is_set():
            msg = self.pubsub.get_message(timeout=0.1)
            if msg is None:
                continue
            now = time.perf_counter()
            task_id = msg["channel"].decode().removeprefix(keys.RESULT_PREFIX)
            status = json.loads(msg["data"])["status"]
            with self._lock:
                self.arrived.setdefault(task_id, (now, status))
                self._lock.notify_all()

    def wait(
        self, task_ids: list[str], timeout_s: float, check: Callable[[], None] | None = None
    ) -> int:
        """Wait until all task_ids arrived or the timeout passed. Returns how many arrived.

        check: called about every 100 ms while waiting; it raises to abort the wait.
        """
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                done = sum(1 for t in task_ids if t in self.arrived)
                left = deadline - time.monotonic()
                if done == len(task_ids) or left <= 0:
                    return done
                if check:
                    check()
                self._lock.wait(min(left, 0.1))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.pubsub.close()


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


@dataclass
class LoadReport:
    rate: float
    sent: int = 0
    done: int = 0
    failed: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    routes: Counter = field(default_factory=Counter)
    mean_batch: float = 0.0
    elapsed_s: float = 0.0

    def percentile(self, p: float) -> float:
        return percentile(self.latencies_ms, p)

    @property
    def achieved_rps(self) -> float:
        return self.done / self.elapsed_s if self.elapsed_s else 0.0


def batch_counters(client: Client, model: str) -> tuple[int, int]:
    """(tasks, batches) summed over the model's live executors."""
    rows = client.table.executors(model)
    return sum(r.tasks for r in rows), sum(r.batches for r in rows)


def poisson(
    client: Client,
    watcher: ResultWatcher,
    model: str,
    rate: float,
    duration_s: float,
    make_inputs=lambda n: [n],
    seed: int = 0,
    drain_s: float = 30.0,
    check: Callable[[], None] = lambda: None,
) -> LoadReport:
    """Submit at Poisson arrivals of `rate` per second for duration_s, then wait for results.
    Each task's latency runs from its scheduled arrival to its result.

    check: called before each submit and while waiting; it raises to abort the load.
    """
    rng = random.Random(seed)
    report = LoadReport(rate=rate)
    tasks0, batches0 = batch_counters(client, model)
    sent_at: dict[str, float] = {}
    start = time.perf_counter()
    next_at = start
    while next_at - start < duration_s:
        check()
        delay = next_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)  # pacing the open-loop arrivals
        result = client.submit(model, make_inputs(len(sent_at)))
        # Timed from the scheduled arrival, not the send: a producer that falls behind
        # counts as latency, as in tandem bench (open loop).
        sent_at[result.id] = next_at
        report.routes[result.route] += 1
        next_at += rng.expovariate(rate)
    report.sent = len(sent_at)
    watcher.wait(list(sent_at), drain_s, check)
    last = start
    for task_id, t0 in sent_at.items():
        arrival = watcher.arrived.get(task_id)
        if arrival is None:
            continue
        report.done += 1
        report.failed += arrival[1] != "SUCCESS"
        report.latencies_ms.append((arrival[0] - t0) * 1000)
        last = max(last, arrival[0])
    report.elapsed_s = last - start
    tasks1, batches1 = batch_counters(client, model)
    if batches1 > batches0:
        report.mean_batch = (tasks1 - tasks0) / (batches1 - batches0)
    return report


def summary(report: LoadReport) -> dict[str, Any]:
    l2 = report.routes["L2"]
    return {
        "offered_rps": report.rate,
        "achieved_rps": round(report.achieved_rps, 1),
        "sent": report.sent,
        "done": report.done,
        "failed": report.failed,
        "p50_ms": round(report.percentile(50), 2),
        "p99_ms": round(report.percentile(99), 2),
        "l2_share": round(l2 / report.sent, 3) if report.sent else 0.0,
        "mean_batch": round(report.mean_batch, 2),
    }
