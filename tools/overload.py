"""`tandem bench --profile overload`: goodput when more is offered than can be served.

Goodput is the tasks answered with SUCCESS within their deadline, per second. Every
task is sent with a deadline of its scheduled arrival plus the SLO. First tandem's
capacity is measured (a burst, no deadlines); then each system gets open-loop Poisson
arrivals at multiples of it, each point on a fresh Redis and fresh workers (as in
bench.py). For each point: goodput, the share of computed tasks that met their
deadline (the rest was device time spent for nobody), the tasks shed at submit
(Overloaded) and at claim (DeadlineExceeded, or Celery's REVOKED for an expired task),
and the latency of the tasks served.

Results are recorded by a process of their own, subscribed to every result channel, as
a caller elsewhere would receive them: the producer's CPU (it sends up to 7,000 tasks a
second here) never delays what is recorded.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis

from tandem.broker import keys
from tandem.broker.errors import Overloaded, QueueFull
from tandem.broker.settings import Settings
from tandem.tools import baselines
from tandem.tools.bench import (
    SYSTEMS,
    Running,
    System,
    arrivals,
    due_groups,
    point_folder,
    rows_table,
)
from tandem.tools.load import percentile
from tandem.tools.samples import sampler

MODEL = "sim:1"
LOADS = (0.5, 1.0, 2.0, 4.0)
SLOS_MS = (100.0, 250.0)
DEFAULT_SYSTEMS = ("tandem", "tandem/no-deadline", "celery-batches/10ms", "celery-plain")
QUICK_SYSTEMS = ("tandem", "tandem/no-deadline")
#: Tasks of the capacity burst, and of the warm-up before each point (two full batches
#: per worker and a few alone, so the latency model has seen small and large batches).
CAPACITY_TASKS = 6000
WARMUP_BURST = 128
WARMUP_SINGLES = 8


@dataclass
class Arrival:
    at: float  # epoch s, when the recorder received it
    status: str
    error: str | None  # exc_type of a FAILURE


def _record(url: str, ready, stop, count, conn) -> None:
    """The recorder process: every result published, with when it arrived."""
    client = redis.Redis.from_url(url)
    pubsub = client.pubsub()
    pubsub.psubscribe(keys.RESULT_PREFIX + "*")
    arrived: dict[str, tuple[float, str, str | None]] = {}
    prefix = len(keys.RESULT_PREFIX)
    while not stop.is_set():
        msg = pubsub.get_message(timeout=0.05)
        if msg is None:
            continue
        if msg["type"] == "psubscribe":
            ready.set()  # Redis confirmed the subscription: nothing published is missed now
            continue
        now = time.time()
        task_id = msg["channel"][prefix:].decode()
        if task_id in arrived:
            continue
        meta = json.loads(msg["data"])
        result = meta.get("result")
        error = result.get("exc_type") if isinstance(result, dict) else None
        arrived[task_id] = (now, meta["status"], error)
        with count.get_lock():
            count.value += 1
    conn.send(arrived)
    pubsub.close()
    client.close()


class Recorder:
    """Results as a caller in another process receives them."""

    def __init__(self, url: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.count = context.Value("q", 0)
        self._ready, self._stop = context.Event(), context.Event()
        self._conn, child = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_record, args=(url, self._ready, self._stop, self.count, child), daemon=True
        )
        self._process.start()
        if not self._ready.wait(30):
            raise RuntimeError("the result recorder did not subscribe within 30 s")

    def wait(self, n: int, timeout_s: float, check=lambda: None) -> int:
        """Until n results arrived in all, or timeout_s passed; returns how many did."""
        deadline = time.monotonic() + timeout_s
        while self.count.value < n and time.monotonic() < deadline:
            check()
            self._stop.wait(0.02)  # polling a counter in shared memory, bounded above
        return self.count.value

    def collect(self) -> dict[str, Arrival]:
        self._stop.set()
        arrived = self._conn.recv()
        self._process.join(10)
        return {task_id: Arrival(*row) for task_id, row in arrived.items()}


def submit(running: Running, batch: list[Any], deadline: float) -> tuple[list[str], int]:
    """Send a batch, each task due by `deadline` (epoch s). Returns the ids accepted and
    how many were refused at submit."""
    if running.system.kind == "tandem":
        try:
            results = running.client.submit_many(
                MODEL, batch, deadline_s=max(0.0, deadline - time.time())
            )
        except (Overloaded, QueueFull) as e:
            results = e.accepted
        return [r.id for r in results], len(batch) - len(results)
    name, queue = (
        (baselines.PLAIN_TASK, baselines.PLAIN_QUEUE)
        if running.system.kind == "plain"
        else (baselines.BATCHES_TASK, baselines.BATCHES_QUEUE)
    )
    expires = datetime.fromtimestamp(deadline, timezone.utc)
    sent = [
        running.app.send_task(name, kwargs={"inputs": x}, queue=queue, expires=expires).id
        for x in batch
    ]
    return sent, 0


def drive(
    running: Running, schedule: list[float], slo_ms: float
) -> tuple[dict[str, float], int, list[float]]:
    """Open-loop arrivals; overdue ones go out together, each with the deadline of the
    earliest in its group. Returns (task id: its due arrival, epoch s), the refused, and
    how late each group went out (ms): a producer that falls behind spends its tasks'
    time before they reach Redis."""
    make = sampler(MODEL, "")
    due: dict[str, float] = {}
    refused = 0
    behind: list[float] = []
    for i, j, start in due_groups(schedule, running.check, clock=time.time):
        at = start + schedule[i]
        behind.append((time.time() - at) * 1000)
        ids, n = submit(running, [make(k) for k in range(i, j)], at + slo_ms / 1000)
        refused += n
        due.update(dict.fromkeys(ids, at))
    return due, refused, behind


def _warm(running: Running, recorder: Recorder) -> None:
    """Bursts and singles, so that tandem's latency model has seen large and small
    batches before the load starts (and every system has run a batch)."""
    make = sampler(MODEL, "")
    sent = running.submit([make(n) for n in range(WARMUP_BURST)])
    recorder.wait(len(sent), 60, running.check)
    for n in range(WARMUP_SINGLES):
        sent += running.submit([make(n)])
        recorder.wait(len(sent), 10, running.check)


def measure_capacity(settings: Settings, workers: int, folder: Path) -> float:
    """tandem's throughput at saturation, tasks/s: a burst with no deadlines, timed between
    the 10th and the 90th percentile of its results' arrivals."""
    running = Running(SYSTEMS["tandem"], settings, workers, folder)
    try:
        recorder = Recorder(running.server.url)
        try:
            _warm(running, recorder)
            warm = recorder.count.value
            make = sampler(MODEL, "")
            burst = running.client.submit_many(MODEL, [make(n) for n in range(CAPACITY_TASKS)])
            ids = [r.id for r in burst]
            recorder.wait(warm + len(ids), 120, running.check)
        finally:
            arrived = recorder.collect()
    finally:
        running.close()
    times = sorted(arrived[t].at for t in ids if t in arrived)
    low, high = times[len(times) // 10], times[9 * len(times) // 10]
    return round((9 * len(times) // 10 - len(times) // 10) / (high - low), 1)


def run_point(
    system: System,
    settings: Settings,
    *,
    load: float,
    capacity: float,
    slo_ms: float,
    seconds: float,
    workers: int,
    drain_s: float,
) -> dict[str, Any]:
    rate = load * capacity
    what = f"overload point {system.name} at {load:g}x"
    with point_folder("tandem-overload-", what) as folder:
        running = Running(system, settings, workers, folder)
        try:
            recorder = Recorder(running.server.url)
            try:
                _warm(running, recorder)
                warm = recorder.count.value
                due, refused, behind = drive(running, arrivals(rate, seconds, 1), slo_ms)
                recorder.wait(warm + len(due), drain_s + slo_ms / 1000, running.check)
                running.stop_workers()
                queued = running.queued()
            finally:
                arrived = recorder.collect()
        finally:
            running.close()
    row = _row(system, load, capacity, slo_ms, seconds, due, refused, arrived, queued)
    row["behind_p50_ms"] = round(percentile(behind, 50), 1)
    row["behind_p99_ms"] = round(percentile(behind, 99), 1)
    return row


def _row(system, load, capacity, slo_ms, seconds, due, refused, arrived, queued) -> dict[str, Any]:
    good, late, shed, failed = [], [], 0, 0
    for task_id, at in due.items():
        got = arrived.get(task_id)
        if got is None:
            continue
        latency = (got.at - at) * 1000
        if got.status == "SUCCESS":
            (good if latency <= slo_ms else late).append(latency)
        elif got.status == "REVOKED" or got.error == "DeadlineExceeded":
            shed += 1
        else:
            failed += 1
    computed = len(good) + len(late)
    served = good + late
    sent = len(due) + refused
    return {
        "system": system.name,
        "slo_ms": slo_ms,
        "load": load,
        "offered_rps": round(load * capacity, 1),
        "capacity_rps": capacity,
        "goodput_rps": round(len(good) / seconds, 1),
        "goodput_share": round(len(good) / seconds / capacity, 3),
        "met_share": round(len(good) / computed, 4) if computed else None,
        "computed": computed,
        "late": len(late),
        "shed_submit": refused,
        "shed_claim": shed,
        "failed": failed,
        "p50_ms": round(percentile(served, 50), 1),
        "p99_ms": round(percentile(served, 99), 1),
        "sent": sent,
        "unfinished": queued,
        "lost": len(due) - sum(1 for t in due if t in arrived) - queued,
    }


def run_overload(
    settings: Settings,
    *,
    systems: list[System],
    loads: tuple[float, ...],
    slos_ms: tuple[float, ...],
    seconds: float,
    workers: int,
    drain_s: float,
    progress=None,
) -> list[dict[str, Any]]:
    settings = settings.replace(models=(MODEL,), max_wait_ms=0.0)
    # A producer that falls behind sends Celery tasks whose expires has passed: Celery
    # warns once per task, which would slow the producer it measures.
    logging.getLogger("celery.app.base").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="tandem-capacity-") as folder:
        capacity = measure_capacity(settings, workers, Path(folder))
    rows = []
    for slo_ms in slos_ms:
        for system in systems:
            for load in loads:
                if progress:
                    progress(f"{system.name}, SLO {slo_ms:g} ms, {load:g}x of {capacity:g}/s")
                rows.append(
                    run_point(
                        system,
                        settings,
                        load=load,
                        capacity=capacity,
                        slo_ms=slo_ms,
                        seconds=seconds,
                        workers=workers,
                        drain_s=drain_s,
                    )
                )
    return rows


COLUMNS = (
    "system",
    "slo_ms",
    "load",
    "offered_rps",
    "goodput_rps",
    "goodput_share",
    "met_share",
    "shed_submit",
    "shed_claim",
    "late",
    "p50_ms",
    "p99_ms",
    "behind_p99_ms",
    "lost",
)


def table(rows: list[dict[str, Any]], title: str):
    return rows_table(title, COLUMNS, rows)


def plot(rows: list[dict[str, Any]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    slos = sorted({r["slo_ms"] for r in rows})
    fig, axes = plt.subplots(1, len(slos), figsize=(6 * len(slos), 4.6), squeeze=False)
    for axis, slo in zip(axes[0], slos, strict=True):
        mine = [r for r in rows if r["slo_ms"] == slo]
        capacity = mine[0]["capacity_rps"]
        for name in dict.fromkeys(r["system"] for r in mine):
            points = sorted((r for r in mine if r["system"] == name), key=lambda r: r["load"])
            axis.plot(
                [r["offered_rps"] for r in points],
                [r["goodput_rps"] for r in points],
                marker="o",
                label=name,
            )
        offered = sorted({r["offered_rps"] for r in mine})
        axis.plot(offered, offered, color="lightgrey", linestyle=":", label="offered")
        axis.axhline(capacity, color="grey", linestyle="--", label="capacity (measured)")
        axis.axhline(
            0.9 * capacity, color="grey", linestyle=":", linewidth=0.8, label="90 % of capacity"
        )
        axis.set(
            xlabel="offered load (req/s)",
            ylabel="goodput (SUCCESS within the SLO, req/s)",
            title=f"SLO {slo:g} ms",
            ylim=(0, capacity * 1.25),
        )
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
