"""`tandem bench`: tandem, plain Celery and celery-batches under the same open-loop load.

Each (system, rate) point gets a fresh Redis and fresh workers, the same model
cost and the same Poisson arrivals. Latency runs from each task's scheduled
arrival to its result as a producer sees it (the result channel), so a
producer falling behind shows as latency, not as a lower rate.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from tandem.broker import keys
from tandem.broker.errors import ProcessExited
from tandem.broker.settings import Settings
from tandem.producers.client import Client
from tandem.server import RedisServer
from tandem.stack import Child, spawn, stop_process, wait_for_executors
from tandem.tools import baselines
from tandem.tools.load import ResultWatcher, percentile
from tandem.tools.samples import sampler

WARMUP_TASKS = 20


@dataclass(frozen=True)
class Profile:
    name: str
    model: str
    rates: tuple[float, ...]
    quick_rates: tuple[float, ...]
    #: Settings the profile changes (the sim model's costs).
    settings: tuple[tuple[str, Any], ...] = ()


PROFILES = {
    "sim": Profile("sim", "sim:1", (10, 100, 300, 600, 1000, 1500, 1800, 2200), (10, 300, 1500)),
    "embed": Profile("embed", "minilm:1", (5, 20, 50, 100, 200, 300), (5, 50, 200)),
    # sim with a CPU-bound preparation per task, as tokenizing is: 0.3 ms a task.
    "prep": Profile(
        "prep",
        "sim:1",
        (10, 300, 1000, 1400, 1800, 2200),
        (10, 1000, 2200),
        (("sim_prep_ms", 0.3),),
    ),
}


@dataclass(frozen=True)
class System:
    name: str
    kind: str  # tandem | plain | batches
    flush_interval_ms: float = 0.0
    pipeline: bool = True  # tandem: prepare the next batch while one computes
    deadline_aware: bool = True  # tandem: shed by predicted finish (off: only the expired)


SYSTEMS = {
    s.name: s
    for s in (
        System("tandem", "tandem"),
        System("tandem/no-pipeline", "tandem", pipeline=False),
        System("tandem/no-deadline", "tandem", deadline_aware=False),
        System("celery-plain", "plain"),
        System("celery-batches/10ms", "batches", 10.0),
        System("celery-batches/50ms", "batches", 50.0),
    )
}


class Running:
    """One system started on its own Redis: submit, count queued, stop."""

    def __init__(self, system: System, settings: Settings, workers: int, folder: Path) -> None:
        self.system = system
        self.server = RedisServer(folder / "redis").start()
        self.settings = settings.replace(redis_url=self.server.url)
        self.redis = redis.Redis.from_url(self.server.url)
        self.processes: list[Child] = []
        self.client: Client | None = None
        self.app = None
        try:
            self._start(workers, folder)
        except BaseException:
            self.close()
            raise

    def _start(self, workers: int, folder: Path) -> None:
        system = self.system
        for n in range(workers):
            worker = self.settings.replace(hostname=f"{system.kind}{n + 1}@bench")
            log = folder / "logs" / f"{system.kind}{n + 1}.log"
            if system.kind == "tandem":
                worker = worker.replace(
                    pipeline=system.pipeline, deadline_aware=system.deadline_aware
                )
                self.processes.append(spawn(["worker"], worker, log))
            else:
                args = [
                    system.kind,
                    f"--hostname={worker.hostname}",
                    f"--flush-interval-ms={system.flush_interval_ms}",
                ]
                self.processes.append(spawn(args, worker, log, module="tandem.tools.baselines"))
        if system.kind == "tandem":
            self.client = Client(settings=self.settings)
            wait_for_executors(self.redis, workers, 120, self.processes)
        else:
            from celery import Celery

            self.app = Celery("bench-producer", broker=self.server.url, backend=self.server.url)
            self.app.conf.update(task_serializer="json", accept_content=["json"])

    def check(self) -> None:
        """Raise ProcessExited, with its log tail, if a worker of this point has exited."""
        for process in self.processes:
            process.check()

    def submit(self, batch: list[Any]) -> list[str]:
        if self.system.kind == "tandem":
            if len(batch) == 1:
                return [self.client.submit(self.settings.models[0], batch[0]).id]
            return [r.id for r in self.client.submit_many(self.settings.models[0], batch)]
        name, queue = (
            (baselines.PLAIN_TASK, baselines.PLAIN_QUEUE)
            if self.system.kind == "plain"
            else (baselines.BATCHES_TASK, baselines.BATCHES_QUEUE)
        )
        return [self.app.send_task(name, kwargs={"inputs": x}, queue=queue).id for x in batch]

    def counters(self) -> tuple[int, int]:
        """(tasks, batches) computed so far."""
        if self.system.kind == "tandem":
            rows = self.client.table.executors()
            return sum(r.tasks for r in rows), sum(r.batches for r in rows)
        tasks, batches = self.redis.mget(baselines.TASKS, baselines.BATCHES)
        return int(tasks or 0), int(batches or 0)

    def queued(self) -> int:
        """Tasks still waiting in Redis (call after the workers stopped)."""
        if self.system.kind == "tandem":
            lists = [*keys.l1_keys(self.settings.models[0])]
            lists += [
                k
                for p in (keys.L2_PREFIX, keys.INFLIGHT_PREFIX)
                for k in self.redis.scan_iter(p + "*")
            ]
            return sum(self.redis.llen(k) for k in lists)
        queue = baselines.PLAIN_QUEUE if self.system.kind == "plain" else baselines.BATCHES_QUEUE
        return self.redis.llen(queue) + self.redis.hlen("unacked")

    def stop_workers(self) -> None:
        for process in self.processes:
            stop_process(process, 60)

    def close(self) -> None:
        self.stop_workers()
        for client in (self.client, self.app):
            if client is not None:
                client.close()
        self.redis.close()
        self.server.stop()


def arrivals(rate: float, seconds: float, seed: int) -> list[float]:
    """Poisson arrival offsets, in seconds from the start."""
    rng, t, out = random.Random(seed), 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return out
        out.append(t)


@contextlib.contextmanager
def point_folder(prefix: str, what: str) -> Iterator[Path]:
    """A temporary folder for one point's Redis and logs: removed when the point ends
    well, kept (and named in the error) when a process of it exited."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    except ProcessExited as e:
        raise ProcessExited(f"{what} aborted (its files are kept in {folder}): {e}") from e
    shutil.rmtree(folder, ignore_errors=True)


def due_groups(
    schedule: list[float], check: Callable[[], None], clock: Callable[[], float] = time.perf_counter
) -> Iterator[tuple[int, int, float]]:
    """Open-loop pacing: sleeps until the next arrival is due, then yields (i, j, start):
    the arrivals schedule[i:j] due now (a producer that fell behind sends them together),
    and the clock at the start. check() runs before each wait."""
    start = clock()
    i = 0
    while i < len(schedule):
        check()
        now = clock() - start
        if schedule[i] > now:
            time.sleep(schedule[i] - now)  # pacing the open-loop arrivals
            continue
        j = i
        while j < len(schedule) and schedule[j] <= now:
            j += 1
        yield i, j, start
        i = j


def drive(running: Running, schedule: list[float], make: Callable[[int], Any]) -> dict[str, float]:
    """Submit at the scheduled times (open loop); late arrivals go out together."""
    due: dict[str, float] = {}
    for i, j, start in due_groups(schedule, running.check):
        for k, task_id in zip(
            range(i, j), running.submit([make(k) for k in range(i, j)]), strict=True
        ):
            due[task_id] = start + schedule[k]
    return due


def run_point(
    system: System,
    settings: Settings,
    rate: float,
    seconds: float,
    *,
    workers: int,
    drain_s: float,
    seed: int = 1,
) -> dict[str, Any]:
    make = sampler(settings.models[0], settings.repository)
    with point_folder("tandem-bench-", f"bench point {system.name} at {rate:g}/s") as folder:
        running = Running(system, settings, workers, folder)
        watcher = ResultWatcher(running.redis)
        try:
            warm = running.submit([make(n) for n in range(WARMUP_TASKS)])
            watcher.wait(warm, 60, running.check)
            tasks0, batches0 = running.counters()
            due = drive(running, arrivals(rate, seconds, seed), make)
            send_end = max(due.values(), default=time.perf_counter())
            watcher.wait(list(due), drain_s, running.check)
            tasks1, batches1 = running.counters()
            running.stop_workers()
            queued = running.queued()
        finally:
            watcher.close()
            running.close()
    arrived = {t: watcher.arrived[t] for t in due if t in watcher.arrived}
    latencies = [(at - due[t]) * 1000 for t, (at, _status) in arrived.items()]
    in_time = sum(1 for at, _ in arrived.values() if at <= send_end)
    batches = batches1 - batches0
    return {
        "system": system.name,
        "offered_rps": rate,
        "achieved_rps": round(in_time / seconds, 1),
        "p50_ms": round(percentile(latencies, 50), 2),
        "p95_ms": round(percentile(latencies, 95), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "mean_batch": round((tasks1 - tasks0) / batches, 2) if batches else 1.0,
        "lost": len(due) - len(arrived) - queued,
        "failed": sum(1 for _, status in arrived.values() if status != "SUCCESS"),
        "sent": len(due),
        "backlog": len(due) - in_time,
        "unfinished": queued,
    }


def limits(settings: Settings, workers: int) -> dict[str, float]:
    """The latency floor (compute of one item) and the throughput ceiling. With a
    preparation cost the ceiling is set by the slower stage of a pipelined executor."""
    if settings.models[0].startswith("sim:"):

        def cost(b: int) -> float:
            compute = settings.sim_base_ms + settings.sim_per_item_ms * b
            return (
                max(compute, settings.sim_prep_ms * b) if b > 1 else compute + settings.sim_prep_ms
            )

    else:
        compute = baselines.make_compute(settings)
        make = sampler(settings.models[0], settings.repository)

        def cost(b: int) -> float:
            batch = [make(n) for n in range(b)]
            compute(batch)
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                compute(batch)
                times.append((time.perf_counter() - t0) * 1000)
            return sorted(times)[2]

    return {
        "floor_ms": round(cost(1), 2),
        "ceiling_rps": round(workers * settings.max_batch / cost(settings.max_batch) * 1000, 1),
    }


def limit_row(limit: dict[str, float], max_batch: int) -> dict[str, Any]:
    floor = limit["floor_ms"]
    return {
        "system": "limit",
        "offered_rps": None,
        "achieved_rps": limit["ceiling_rps"],
        "p50_ms": floor,
        "p95_ms": floor,
        "p99_ms": floor,
        "mean_batch": max_batch,
        "lost": 0,
        "failed": 0,
        "sent": 0,
        "backlog": 0,
        "unfinished": 0,
    }


def save_json(rows: list[dict[str, Any]], path: str) -> None:
    Path(path).write_text(json.dumps(rows, indent=2) + "\n")


def plot(rows: list[dict[str, Any]], limit: dict[str, float], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (latency, throughput) = plt.subplots(1, 2, figsize=(12, 4.8))
    measured = [r for r in rows if r["system"] != "limit"]
    for name in dict.fromkeys(r["system"] for r in measured):
        mine = sorted((r for r in measured if r["system"] == name), key=lambda r: r["offered_rps"])
        offered = [r["offered_rps"] for r in mine]
        latency.plot(offered, [r["p99_ms"] for r in mine], marker="o", label=name)
        throughput.plot(offered, [r["achieved_rps"] for r in mine], marker="o", label=name)
    latency.axhline(limit["floor_ms"], color="grey", linestyle="--", label="floor (1 item)")
    throughput.axhline(limit["ceiling_rps"], color="grey", linestyle="--", label="ceiling")
    offered = sorted({r["offered_rps"] for r in measured})
    throughput.plot(offered, offered, color="lightgrey", linestyle=":", label="offered")
    latency.set(
        xlabel="offered load (req/s)", ylabel="p99 latency (ms)", yscale="log", title="p99 latency"
    )
    throughput.set(xlabel="offered load (req/s)", ylabel="achieved (req/s)", title="throughput")
    for axis in (latency, throughput):
        axis.set_xscale("log")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


COLUMNS = (
    "system",
    "offered_rps",
    "achieved_rps",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "mean_batch",
    "lost",
    "failed",
    "backlog",
)


def table(rows: list[dict[str, Any]], title: str):
    return rows_table(title, COLUMNS, rows, dim=lambda row: row["system"] == "limit")


def rows_table(title: str, columns, rows: list[dict[str, Any]], *, dim=lambda row: False):
    """A rich table of rows (dicts) in `columns`, the first on the left, None as "-"."""
    from rich.table import Table

    out = Table(title=title)
    for n, column in enumerate(columns):
        if n == 0:
            out.add_column(column.replace("_", " "), no_wrap=True, min_width=19)
        else:
            out.add_column(column.replace("_", " "), justify="right")
    for row in rows:
        out.add_row(
            *("-" if row[c] is None else str(row[c]) for c in columns),
            style="dim" if dim(row) else None,
        )
    return out


def point_line(row: dict[str, Any]) -> str:
    """One measured point, as a line for a log."""
    return (
        f"{row['system']} at {row['offered_rps']:g}/s: {row['achieved_rps']:g} done/s, "
        f"p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms"
    )


def run_bench(
    settings: Settings,
    *,
    profile: Profile,
    systems: list[System],
    rates: tuple[float, ...],
    seconds: float,
    workers: int,
    drain_s: float,
    json_path: str | None,
    plot_path: str | None,
    console=None,
) -> list[dict[str, Any]]:
    from rich.console import Console
    from rich.progress import Progress

    console = console or Console(width=max(Console().width, 110))
    settings = settings.replace(models=(profile.model,), max_wait_ms=0.0, **dict(profile.settings))
    limit = limits(settings, workers)
    rows = []
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task("bench", total=len(systems) * len(rates))
        for system in systems:
            for rate in rates:
                progress.update(bar, description=f"{system.name} at {rate:g}/s")
                row = run_point(system, settings, rate, seconds, workers=workers, drain_s=drain_s)
                rows.append(row)
                progress.advance(bar)
                if not console.is_terminal:  # no progress bar in a log or a pipe: a line
                    console.print(point_line(row))
    rows.append(limit_row(limit, settings.max_batch))
    title = (
        f"tandem bench, profile {profile.name}: {profile.model}, {workers} workers, "
        f"max batch {settings.max_batch}, {seconds:g}s per point"
    )
    console.print(table(rows, title))
    console.print(
        f"floor = compute of 1 item = {limit['floor_ms']} ms; ceiling = {workers} "
        f"workers x {settings.max_batch} / cost({settings.max_batch}) = "
        f"{limit['ceiling_rps']} req/s. lost = sent - done - still queued; "
        "backlog = not done when the arrivals ended."
    )
    if json_path:
        save_json(rows, json_path)
    if plot_path:
        plot(rows, limit, plot_path, title)
    return rows
