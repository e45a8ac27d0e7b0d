"""The one harness every `tandem bench` profile, `tandem demo` and `tandem soak` run on.

Written once here:
- a point's stack (`Point`): a fresh Redis in a folder of its own and the workers of
  one system (tandem, plain Celery or celery-batches), with tandem's HTTP gateway if
  asked; closed in reverse, its folder kept and named if a process of it exited;
- open-loop arrivals (`arrivals`, `drive`): Poisson at a rate or along a trace, each
  sent at its scheduled time, what is overdue sent together, every task timed from its
  scheduled arrival, so a producer that falls behind shows as latency;
- the results as a caller in another process receives them (`Recorder`);
- paths timed alternately in blocks at fixed spacings (`alternate`);
- the figures (`percentile`, `burst_rate`, `RedisMeter`, `process_cpu_s`);
- the report (`Report`): rich tables and lines, its JSON, its plot (tools/plots.py).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import random
import shutil
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis

from tandem.broker import keys
from tandem.broker.errors import Overloaded, ProcessExited, QueueFull
from tandem.broker.settings import Settings
from tandem.producers.client import Client
from tandem.server import RedisServer, free_port
from tandem.stack import Child, spawn, stop_process, wait_for_executors

# -- the systems and a point's stack -------------------------------------------------


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


def system(name: str) -> System:
    """The system of that name; ValueError naming the known ones otherwise."""
    try:
        return SYSTEMS[name.strip()]
    except KeyError:
        raise ValueError(f"unknown system {name!r}; known: {', '.join(SYSTEMS)}") from None


class Point:
    """One system on its own Redis: workers (and the HTTP gateway if asked), a producer,
    submit, count what was computed and what is still queued, stop."""

    def __init__(
        self,
        system: System,
        settings: Settings,
        workers: int,
        folder: Path,
        *,
        gateway: bool = False,
    ) -> None:
        self.system = system
        self.folder = folder
        self.server = RedisServer(folder / "redis").start()
        self.settings = settings.replace(redis_url=self.server.url)
        self.redis = redis.Redis.from_url(self.server.url)
        self.processes: list[Child] = []
        self.gateway: Child | None = None
        self.client: Client | None = None
        self.app = None
        try:
            self._start(workers, gateway)
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        return self.server.url

    def _start(self, workers: int, gateway: bool) -> None:
        from tandem.tools import baselines

        system = self.system
        for n in range(workers):
            worker = self.settings.replace(hostname=f"{system.kind}{n + 1}@bench")
            log = self.folder / "logs" / f"{system.kind}{n + 1}.log"
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
                self.processes.append(spawn(args, worker, log, module=baselines.__name__))
        if system.kind == "tandem":
            self.client = Client(settings=self.settings)
            wait_for_executors(self.redis, workers, 120, self.processes)
        else:
            self.app = baselines.producer(self.server.url)
        if gateway:
            self._start_gateway()

    def _start_gateway(self) -> None:
        port, grpc_port = free_port(), free_port()
        self.http_url = f"http://127.0.0.1:{port}"
        self.grpc_address = f"127.0.0.1:{grpc_port}"
        self.gateway = spawn(
            ["http", f"--port={port}", f"--grpc-port={grpc_port}", "--max-concurrency=100000"],
            self.settings,
            self.folder / "logs" / "gateway.log",
        )
        self.processes.append(self.gateway)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self.gateway.check()
            try:
                with urllib.request.urlopen(self.http_url + "/v2/health/ready", timeout=2):
                    return  # 200: urlopen raises on anything else
            except OSError:
                pass
            time.sleep(0.1)  # polling the gateway's readiness, bounded by the deadline
        raise RuntimeError("the gateway was not ready within 60 s")

    def check(self) -> None:
        """Raise ProcessExited, with its log tail, if a process of this point has exited."""
        for process in self.processes:
            process.check()

    def submit(self, batch: list[Any], deadline: float | None = None) -> tuple[list[str], int]:
        """Send a batch, each task due by `deadline` (epoch s) if given. Returns the ids
        accepted and how many were refused at submit."""
        model = self.settings.models[0]
        if self.client is not None:
            left = None if deadline is None else max(0.0, deadline - time.time())
            try:
                if len(batch) == 1 and left is None:
                    return [self.client.submit(model, batch[0]).id], 0
                results = self.client.submit_many(model, batch, deadline_s=left)
            except (Overloaded, QueueFull) as e:
                results = list(e.accepted)
            return [r.id for r in results], len(batch) - len(results)
        from tandem.tools import baselines

        name, queue = baselines.task_of(self.system.kind)
        assert self.app is not None  # a Celery point
        expires = None if deadline is None else datetime.fromtimestamp(deadline, timezone.utc)
        sent = [
            self.app.send_task(name, kwargs={"inputs": x}, queue=queue, expires=expires).id
            for x in batch
        ]
        return sent, 0

    def counters(self, at_least: int = 0, timeout_s: float = 5.0) -> tuple[int, int]:
        """(tasks, batches) computed so far, once at least `at_least` tasks are counted or
        timeout_s passed: tandem's workers count their batches after the results."""
        if self.client is not None:
            deadline = time.monotonic() + timeout_s
            while True:
                rows = self.client.table.executors()
                counted = sum(r.tasks for r in rows)
                if counted >= at_least or time.monotonic() > deadline:
                    return counted, sum(r.batches for r in rows)
                time.sleep(0.02)  # polling Redis for the counts, bounded above
        from tandem.tools import baselines

        tasks, batches = self.redis.mget(baselines.TASKS, baselines.BATCHES)
        return int(tasks or 0), int(batches or 0)

    def queued(self) -> int:
        """Tasks still waiting in Redis (call after the workers stopped)."""
        if self.client is not None:
            lists = [*keys.l1_keys(self.settings.models[0])]
            lists += [
                k
                for p in (keys.L2_PREFIX, keys.INFLIGHT_PREFIX)
                for k in self.redis.scan_iter(p + "*")
            ]
            return sum(self.redis.llen(k) for k in lists)
        from tandem.tools import baselines

        _, queue = baselines.task_of(self.system.kind)
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


# -- open-loop arrivals --------------------------------------------------------------


def arrivals(rate: float | Callable[[float], float], seconds: float, seed: int) -> list[float]:
    """Poisson arrival offsets, in seconds from the start, at `rate` per second: a number,
    or a function of the time (thinning a process at its peak, sampled every 0.1 s)."""
    rng = random.Random(seed)
    at = rate if callable(rate) else None
    peak = max(at(t / 10) for t in range(int(seconds * 10))) if at else float(rate)  # type: ignore[arg-type]
    t, out = 0.0, []  # type: tuple[float, list[float]]
    while True:
        t += rng.expovariate(peak)
        if t >= seconds:
            return out
        if at is None or rng.random() * peak <= at(t):
            out.append(t)


def due_groups(
    schedule: Sequence[float],
    check: Callable[[], None],
    clock: Callable[[], float] = time.time,
    stop: Callable[[], bool] = lambda: False,
) -> Iterator[tuple[int, int, float]]:
    """Open-loop pacing: sleeps until the next arrival is due, then yields (i, j, start):
    the arrivals schedule[i:j] due now (a producer that fell behind sends them together),
    and the clock at the start. check() runs before each wait; stop() ends it early."""
    start = clock()
    i = 0
    while i < len(schedule) and not stop():
        check()
        now = clock() - start
        if schedule[i] > now:
            time.sleep(min(schedule[i] - now, 0.1))  # pacing the open-loop arrivals
            continue
        j = i
        while j < len(schedule) and schedule[j] <= now:
            j += 1
        yield i, j, start
        i = j


@dataclass
class Sent:
    """What drive() sent: each accepted task's scheduled arrival, the scheduled arrivals
    of those refused at submit, how late each group went out, and the schedule's start
    (all epoch s, lateness in ms)."""

    due: dict[str, float] = field(default_factory=dict)
    refused: list[float] = field(default_factory=list)
    behind_ms: list[float] = field(default_factory=list)
    began: float = 0.0


def drive(
    schedule: Sequence[float],
    submit: Callable[[list[Any], float], tuple[list[str], int]],
    check: Callable[[], None],
    make: Callable[[int], Any] = lambda k: [k],
    stop: Callable[[], bool] = lambda: False,
) -> Sent:
    """Send each arrival at its scheduled time (open loop). submit(batch, at) sends the
    tasks due now, `at` the earliest one's scheduled arrival (epoch s), and returns the
    ids accepted and how many were refused. A task is timed from its own arrival; where
    the ids are fewer than the group, from the group's earliest."""
    sent = Sent(began=time.time())
    for i, j, start in due_groups(schedule, check, stop=stop):
        at = start + schedule[i]
        sent.began = start
        sent.behind_ms.append((time.time() - at) * 1000)
        ids, refused = submit([make(k) for k in range(i, j)], at)
        sent.refused += [at] * refused
        if len(ids) == j - i:
            sent.due.update(zip(ids, (start + schedule[k] for k in range(i, j)), strict=True))
        else:
            sent.due.update(dict.fromkeys(ids, at))
    return sent


# -- the results, as a caller receives them ------------------------------------------


@dataclass
class Arrival:
    at: float  # epoch s, when the recorder received it
    status: str
    error: str | None  # exc_type of a FAILURE


def _record(url: str, ready, stop, dump, count, conn) -> None:
    """The recorder process: every result published, with when it arrived; sent back
    whenever `dump` is set, and once `stop` is."""
    client = redis.Redis.from_url(url)
    pubsub = client.pubsub()
    pubsub.psubscribe(keys.RESULT_PREFIX + "*")
    arrived: dict[str, tuple[float, str, str | None]] = {}
    prefix = len(keys.RESULT_PREFIX)
    while not stop.is_set():
        if dump.is_set():
            conn.send(arrived)
            dump.clear()
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
    """Every result published, as a caller in another process receives it: the producer's
    CPU never delays what is recorded."""

    def __init__(self, url: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.count = context.Value("q", 0)
        self._ready, self._stop, self._dump = context.Event(), context.Event(), context.Event()
        self._conn, child = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_record,
            args=(url, self._ready, self._stop, self._dump, self.count, child),
            daemon=True,
        )
        self._process.start()
        if not self._ready.wait(30):
            raise RuntimeError("the result recorder did not subscribe within 30 s")

    def wait(self, n: int, timeout_s: float, check: Callable[[], None] = lambda: None) -> int:
        """Until n results arrived in all, or timeout_s passed; returns how many did."""
        deadline = time.monotonic() + timeout_s
        while self.count.value < n and time.monotonic() < deadline:
            check()
            self._stop.wait(0.02)  # polling a counter in shared memory, bounded above
        return self.count.value

    def collect_so_far(self) -> dict[str, Arrival]:
        """Every result received so far, by task id; recording goes on."""
        self._dump.set()
        return {task_id: Arrival(*row) for task_id, row in self._conn.recv().items()}

    def collect(self) -> dict[str, Arrival]:
        """Stop recording; every result received, by task id."""
        self._stop.set()
        arrived = self._conn.recv()
        self._process.join(10)
        return {task_id: Arrival(*row) for task_id, row in arrived.items()}


# -- paths timed alternately ---------------------------------------------------------


def alternate(
    paths: dict[str, Callable[[], Any]],
    spacings_ms: Sequence[float],
    tasks: int,
    block: int,
    progress: Callable[[str], None] = lambda text: None,
) -> dict[float, dict[str, list[Any]]]:
    """Each path one task at a time, `spacing` apart, the paths taking turns in blocks of
    `block` so that all see the same machine; every path warmed by a block first. Returns
    spacing -> path -> what each call returned (its timing)."""
    for _ in range(block):
        for send in paths.values():
            send()
    out: dict[float, dict[str, list[Any]]] = {}
    for spacing in spacings_ms:
        progress(f"spacing {spacing:g} ms: {tasks} tasks of each path, blocks of {block}")
        times: dict[str, list[Any]] = {name: [] for name in paths}
        for _ in range(0, tasks, block):
            for name, send in paths.items():
                for _ in range(block):
                    times[name].append(send())
                    time.sleep(spacing / 1000)  # the spacing between tasks: the load itself
        out[spacing] = times
    return out


# -- the figures ---------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (nearest rank); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def counted(client: redis.Redis, model: str, tasks: int, timeout_s: float = 10.0) -> dict:
    """The model's metrics counters, once they count `tasks` outcomes or timeout_s passed:
    a worker adds a batch's counters after its results (workers/returner.py)."""
    deadline = time.monotonic() + timeout_s
    while True:
        raw: dict[bytes, bytes] = client.hgetall(keys.metrics(model))  # type: ignore[assignment]
        found = {k.decode(): float(v) for k, v in raw.items()}
        outcomes = found.get("outcome:SUCCESS", 0) + found.get("outcome:FAILURE", 0)
        if outcomes >= tasks or time.monotonic() > deadline:
            return found
        time.sleep(0.02)  # polling Redis for the counts, bounded above


def burst_rate(times: Sequence[float]) -> float:
    """A burst's throughput, per second: its results' arrival times, timed between the
    10th and the 90th percentile (the ramp up and the tail left out)."""
    ordered = sorted(times)
    low, high = len(ordered) // 10, 9 * len(ordered) // 10
    return round((high - low) / (ordered[high] - ordered[low]), 1)


class RedisMeter:
    """Redis's own CPU seconds and command counts between start() and read()."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def _cpu(self) -> float:
        info = self.client.info("cpu")
        return info["used_cpu_user"] + info["used_cpu_sys"]

    def start(self) -> RedisMeter:
        self.client.config_resetstat()
        self.cpu0, self.t0 = self._cpu(), time.monotonic()
        return self

    def read(self) -> dict[str, Any]:
        cpu, elapsed = self._cpu() - self.cpu0, time.monotonic() - self.t0
        stats = self.client.info("commandstats")
        scripts = stats.get("cmdstat_evalsha", {})
        calls = self.client.info("stats")["total_commands_processed"]
        return {
            "cpu_s": cpu,
            "elapsed_s": elapsed,
            "commands": calls,
            "script_calls": scripts.get("calls", 0),
            "script_us": scripts.get("usec", 0),
            #: Redis's time in each command (inside scripts too, and EVALSHA the scripts'
            #: own), µs: where a change in the CPU per task comes from.
            "usec_by_command": {
                name.removeprefix("cmdstat_"): stat["usec"] for name, stat in stats.items()
            },
        }


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a Linux process so far (utime and stime of its stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the report ----------------------------------------------------------------------


def rows_table(title: str, columns: Sequence[str], rows: list[dict[str, Any]], *, dim=None):
    """A rich table of rows (dicts) in `columns`, the first on the left, None as "-";
    dim(row) greys a row out."""
    from rich.table import Table

    out = Table(title=title)
    for n, column in enumerate(columns):
        if n == 0:
            out.add_column(column.replace("_", " "), no_wrap=True, min_width=19)
        else:
            out.add_column(column.replace("_", " "), justify="right")
    for row in rows:
        out.add_row(
            *("-" if row.get(c) is None else str(row[c]) for c in columns),
            style="dim" if dim and dim(row) else None,
        )
    return out


@dataclass
class Report:
    """What a profile prints, writes as JSON (`data`) and draws (`draw(path)`)."""

    data: Any
    parts: list[Any] = field(default_factory=list)  # rich tables and lines, in order
    draw: Callable[[str], None] | None = None

    def table(self, title: str, columns: Sequence[str], rows: list[dict], **kw) -> Report:
        self.parts.append(rows_table(title, columns, rows, **kw))
        return self

    def line(self, text: str) -> Report:
        self.parts.append(text)
        return self

    def show(self, console) -> None:
        for part in self.parts:
            console.print(part)

    def save(self, json_path: str | None, plot_path: str | None) -> None:
        if json_path:
            Path(json_path).write_text(json.dumps(self.data, indent=2) + "\n")
        if plot_path and self.draw:
            self.draw(plot_path)
