"""`tandem bench --profile fleet` and `--profile overhead`: what tandem costs Redis as the
fleet grows, on one machine.

fleet: route cost per submit at 2 to 1,024 registered executors (no workers; all
WORKING, then one IDLE among them); Redis CPU per task on the whole zero-cost path
(one worker, a burst); Redis's and the coordinator's load with hundreds of idle sim
executors (several per worker); and the fairness of routing at low load (tasks per executor).
overhead: a zero-cost model behind tandem, plain Celery and celery-batches, each with
the same workers and the same burst: tasks/s and Redis CPU per task.

Redis CPU is the server process's own (INFO cpu: user + sys), so it counts parsing and
network work too; `script_us_per_task` is the time inside tandem's scripts (INFO
commandstats, EVALSHA).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import redis

from tandem.broker import keys, message
from tandem.broker.settings import load_settings
from tandem.broker.table import Table
from tandem.server import RedisServer
from tandem.stack import Child, Stack, spawn, stop_process, wait_for_executors
from tandem.tools.harness import SYSTEMS, Point, RedisMeter, Report, process_cpu_s
from tandem.tools.plots import figure, save_figure

MODEL = "sim:1"
SIZES = (2, 32, 256, 1024)


def route_cost(size: int, tasks: int, folder: Path) -> dict[str, Any]:
    """µs of script time per single-task route, all WORKING and with one IDLE."""
    server = RedisServer(folder / f"redis-{size}").start()
    try:
        client = redis.Redis.from_url(server.url)
        table = Table(client)
        for n in range(size):
            table.register(
                f"e{n}", MODEL, worker="fleet", max_batch=32, ttl_ms=600_000, max_wait_ms=5.0, pid=0
            )
        row: dict[str, Any] = {"executors": size}
        envelopes = [message.encode(MODEL, [n], queue=keys.l1(MODEL))[1] for n in range(500)]
        for case in ("all_busy", "one_idle"):
            if case == "one_idle":
                client.delete(*keys.l1_keys(MODEL))
                assert table.claim_or_idle("e0", MODEL, 32) is None
            meter = RedisMeter(client).start()
            for _ in range(tasks // len(envelopes)):
                with client.pipeline(transaction=False) as pipe:
                    for envelope in envelopes:
                        table.route_on(pipe, MODEL, [envelope])
                    pipe.execute()
            m = meter.read()
            row[f"{case}_us_per_route"] = round(m["script_us"] / m["script_calls"], 1)
            row[f"{case}_routes_per_s"] = round(m["script_calls"] / m["elapsed_s"])
        client.close()
        return row
    finally:
        server.stop()


def path_cost(tasks: int, folder: Path) -> dict[str, Any]:
    """One worker serving sim at zero cost; a burst of `tasks` through the whole path."""
    settings = load_settings(models=(MODEL,), sim_base_ms=0.0, sim_per_item_ms=0.0)
    with Stack(settings, workers=1, data_dir=folder) as stack:
        from tandem.producers.client import Client

        with Client(settings=stack.settings) as client:
            client.submit(MODEL, [0]).get(timeout=30)
            time.sleep(2 * settings.heartbeat_s)  # a heartbeat has seen no revocations
            (before,) = client.table.executors(MODEL)
            meter = RedisMeter(client.redis).start()
            client.submit_many(MODEL, [[n] for n in range(tasks)])
            _wait(lambda: client.table.executors(MODEL)[0].tasks >= before.tasks + tasks, 120)
            m = meter.read()
            (after,) = client.table.executors(MODEL)
    batches = after.batches - before.batches
    return {
        "tasks": tasks,
        "batches": batches,
        "redis_cpu_us_per_task": round(m["cpu_s"] * 1e6 / tasks, 1),
        "script_us_per_task": round(m["script_us"] / tasks, 1),
        "executor_scripts_per_batch": round((m["script_calls"] - tasks / 256) / batches, 2),
    }


def idle_load(executors: int, per_worker: int, seconds: float, folder: Path) -> dict[str, Any]:
    """Redis calls and CPU per second while `executors` sim executors sit IDLE."""
    server = RedisServer(folder / "redis-idle").start()
    workers: list[Child] = []
    try:
        settings = load_settings(redis_url=server.url, models=(MODEL,))
        count = -(-executors // per_worker)
        for n in range(count):
            mine = min(per_worker, executors - n * per_worker)
            chosen = settings.replace(hostname=f"idle{n}@fleet", executors_per_model=mine)
            workers.append(spawn(["worker"], chosen, folder / "logs" / f"idle{n}.log"))
        coordinator = spawn(["coordinator"], settings, folder / "logs" / "coordinator.log")
        workers.append(coordinator)
        client = redis.Redis.from_url(server.url)
        wait_for_executors(client, executors, 300, workers)
        meter = RedisMeter(client).start()
        coordinator_s = process_cpu_s(coordinator.pid)
        time.sleep(seconds)  # the measurement window itself
        m = meter.read()
        coordinator_s = process_cpu_s(coordinator.pid) - coordinator_s
        client.close()
    finally:
        for worker in workers:
            stop_process(worker, 60)
        server.stop()
    return {
        "idle_executors": executors,
        "workers": count,
        "redis_calls_per_s": round(m["commands"] / m["elapsed_s"]),
        "redis_cpu_percent": round(100 * m["cpu_s"] / m["elapsed_s"], 2),
        "coordinator_cpu_percent": round(100 * coordinator_s / m["elapsed_s"], 2),
    }


def fairness(executors: int, rate: float, seconds: float, folder: Path) -> dict[str, Any]:
    """Tasks per executor after `seconds` of `rate` req/s on `executors` idle ones."""
    settings = load_settings(models=(MODEL,), executors_per_model=executors)
    with Stack(settings, workers=1, data_dir=folder / "fair") as stack:
        from tandem.producers.client import Client

        with Client(settings=stack.settings) as client:
            wait_for_executors(client.redis, executors, 120)
            sent = []
            for _ in range(int(rate * seconds)):
                sent.append(client.submit(MODEL, [0]))
                time.sleep(1 / rate)  # pacing the low load
            for result in sent:
                result.get(timeout=30)
            # A batch's counts follow its results (count.lua): wait for the last ones.
            _wait(lambda: sum(e.tasks for e in client.table.executors(MODEL)) >= len(sent), 30)
            per = [e.tasks for e in client.table.executors(MODEL)]
    return {
        "executors": executors,
        "tasks": sum(per),
        "min_per_executor": min(per),
        "max_per_executor": max(per),
        "stdev": round(statistics.pstdev(per), 2),
        "per_executor": sorted(per),
    }


def overhead(system: str, tasks: int, workers: int, folder: Path) -> dict[str, Any]:
    """A zero-cost model: a burst of `tasks` through `system`; tasks/s and Redis CPU."""
    settings = load_settings(models=(MODEL,), sim_base_ms=0.0, sim_per_item_ms=0.0)
    point = Point(SYSTEMS[system], settings, workers, folder / system.replace("/", "-"))
    try:
        first, _ = point.submit([[0]])
        _wait(Stored(point.redis, first), 60)
        done0, batches0 = point.counters(at_least=1)
        pids = [process.pid for process in point.processes]
        workers0, producer0 = sum(map(process_cpu_s, pids)), time.process_time()
        meter = RedisMeter(point.redis).start()
        ids: list[str] = []
        for start in range(0, tasks, 256):
            ids += point.submit([[n] for n in range(start, min(start + 256, tasks))])[0]
        _wait(Stored(point.redis, ids), 300)
        m = meter.read()
        done, batches = point.counters(at_least=1 + len(ids))
        # What the workers still do for these tasks (their bookkeeping, exporting their
        # spans when traced) counts as theirs: read once their CPU stops moving.
        workers_s = settled_cpu_s(pids) - workers0
        producer_s = time.process_time() - producer0
    finally:
        point.close()
    mean_batch = (done - done0) / (batches - batches0) if batches > batches0 else 1.0
    return {
        "system": system,
        "tasks": tasks,
        "tasks_per_s": round(tasks / m["elapsed_s"]),
        "workers_cpu_us_per_task": round(workers_s * 1e6 / tasks, 1),
        "producer_cpu_us_per_task": round(producer_s * 1e6 / tasks, 1),
        "redis_cpu_us_per_task": round(m["cpu_s"] * 1e6 / tasks, 1),
        "redis_calls_per_task": round(m["commands"] / tasks, 2),
        "mean_batch": round(mean_batch, 1),
        "redis_us_per_task_by_command": {
            name: round(usec / tasks, 2)
            for name, usec in sorted(m["usec_by_command"].items(), key=lambda kv: -kv[1])
            if usec / tasks >= 0.05
        },
    }


class Stored:
    """Called, True once every task has a stored result. It remembers how far the results
    were all stored and asks only past that, a few at a time, so that watching a burst
    costs Redis about one EXISTS per result, not one per result per poll: the overhead
    profile counts Redis's CPU while it watches."""

    CHUNK = 64

    def __init__(self, client: redis.Redis, task_ids: list[str]) -> None:
        self.client, self.task_ids, self.done = client, task_ids, 0

    def __call__(self) -> bool:
        while self.done < len(self.task_ids):
            chunk = [keys.result(i) for i in self.task_ids[self.done : self.done + self.CHUNK]]
            if self.client.exists(*chunk) < len(chunk):
                return False
            self.done += len(chunk)
        return True


def settled_cpu_s(pids: list[int], quiet_s: float = 0.002, timeout_s: float = 20.0) -> float:
    """The processes' CPU seconds, read once they used under quiet_s of it in 0.25 s."""
    deadline = time.monotonic() + timeout_s
    last = sum(map(process_cpu_s, pids))
    while time.monotonic() < deadline:
        time.sleep(0.25)  # sampling CPU time: the interval is the measurement
        now = sum(map(process_cpu_s, pids))
        if now - last < quiet_s:
            return now
        last = now
    return last


def _wait(condition, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done in {timeout_s} s")
        time.sleep(0.02)  # polling counters, bounded by the deadline


def run_fleet(folder: Path, *, quick: bool) -> dict[str, Any]:
    sizes = SIZES[:2] if quick else SIZES
    idle = 100 if quick else 500
    return {
        "route": [route_cost(size, 5_000 if quick else 10_000, folder) for size in sizes],
        "path": path_cost(3_200 if quick else 6_400, folder / "path"),
        "idle": idle_load(idle, 100, 5 if quick else 10, folder),
        "fairness": fairness(8 if quick else 16, 20, 5 if quick else 10, folder),
    }


def run_overhead(
    systems: list[str], folder: Path, *, quick: bool, workers: int, tasks: int = 0
) -> list[dict[str, Any]]:
    tasks = tasks or (2_000 if quick else 6_400)
    return [overhead(system, tasks, workers, folder) for system in systems]


#: Route cost before O(1) routing: µs of script time per route with every executor
#: WORKING, measured by route_cost on commit 1aea2b2 (the route scanned every executor).
BEFORE_ROUTE_US = {2: 19.7, 32: 75.2, 256: 590.0, 1024: 2691.0}


def plot_fleet(report: dict[str, Any], path: str) -> None:
    fig, (route, fair) = figure(2, height=4.8)
    sizes = [row["executors"] for row in report["route"]]
    before = [BEFORE_ROUTE_US[n] for n in sizes if n in BEFORE_ROUTE_US]
    route.plot(sizes[: len(before)], before, marker="o", label="before (scan every executor)")
    for case, label in (("all_busy", "ready set, all busy"), ("one_idle", "ready set, one idle")):
        route.plot(
            sizes, [r[f"{case}_us_per_route"] for r in report["route"]], marker="o", label=label
        )
    route.set(
        xscale="log",
        yscale="log",
        xlabel="registered executors of the model",
        ylabel="Redis script time per route (µs)",
        title="route cost as the fleet grows",
    )
    per = report["fairness"]["per_executor"]
    fair.bar(range(len(per)), per)
    fair.set(
        xlabel="executor (sorted)",
        ylabel="tasks",
        title=f"fairness: {report['fairness']['tasks']} tasks at low load",
    )
    save_figure(fig, path)


def plot_overhead(rows: list[dict[str, Any]], path: str) -> None:
    fig, (rate, cpu) = figure(2, height=4.4)
    names = [row["system"] for row in rows]
    rate.bar(names, [row["tasks_per_s"] for row in rows])
    rate.set(ylabel="tasks/s", title="a zero-cost model: throughput of a burst")
    cpu.bar(names, [row["redis_cpu_us_per_task"] for row in rows], color="tab:orange")
    cpu.set(ylabel="µs", title="Redis CPU per task")
    for axis in (rate, cpu):
        axis.tick_params(axis="x", labelsize=8)
    save_figure(fig, path)


def fleet_report(folder: Path, quick: bool) -> Report:
    report = run_fleet(folder, quick=quick)
    rows = [{**row, "before_us": BEFORE_ROUTE_US.get(row["executors"])} for row in report["route"]]
    columns = (
        "executors",
        "before_us",
        "all_busy_us_per_route",
        "all_busy_routes_per_s",
        "one_idle_us_per_route",
    )
    out = Report(report, draw=lambda path: plot_fleet(report, path))
    out.table("route cost per submit (Redis script time)", columns, rows)
    for name in ("path", "idle", "fairness"):
        out.line(f"{name}: {report[name]}")
    return out


def overhead_report(names: list[str], folder: Path, quick: bool, workers: int) -> Report:
    rows = run_overhead(names, folder, quick=quick, workers=workers)
    out = Report(rows, draw=lambda path: plot_overhead(rows, path))
    columns = [c for c, v in rows[0].items() if not isinstance(v, dict)]
    out.table("overhead: a zero-cost model, one burst", columns, rows)
    for row in rows:  # the largest shares of Redis's time per task, by command
        top = list(row["redis_us_per_task_by_command"].items())[:6]
        out.line(
            f"{row['system']}: Redis µs per task by command: "
            + ", ".join(f"{name} {us}" for name, us in top)
        )
    return out
