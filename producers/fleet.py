"""Route cost as the fleet grows: `python -m producers.fleet [--sizes 2,32,256,1024]`;
and `--path`: Redis CPU per task and scripts per batch on the whole zero-cost path.

For each fleet size it starts a Redis of its own, registers that many executors of one
model, all WORKING (the high-load case, where every task goes to L1), routes tasks in
pipelined batches and reports Redis's own CPU time per route (INFO commandstats) and the
pipelined submits per second. Then one executor goes IDLE among them, and the same again
(every task to that one's L2, until its capacity is used, then L1). No workers run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import redis

from broker import keys, message
from broker.server import RedisServer
from broker.settings import load_settings
from broker.stack import Stack
from broker.table import Table
from producers.client import Client

MODEL = "sim:1"


def route_cost(
    client: redis.Redis, table: Table, tasks: int, chunk: int = 500
) -> tuple[float, float]:
    """(Redis CPU µs per route, pipelined routes per second)."""
    envelopes = [message.encode(MODEL, [n], queue=keys.l1(MODEL))[1] for n in range(chunk)]
    client.config_resetstat()
    started = time.perf_counter()
    for _ in range(tasks // chunk):
        with client.pipeline(transaction=False) as pipe:
            for envelope in envelopes:
                table.route_in(pipe, MODEL, [envelope], l1_key=keys.l1(MODEL))
            pipe.execute()
    elapsed = time.perf_counter() - started
    stats = client.info("commandstats")
    calls = sum(v["calls"] for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))
    usec = sum(v["usec"] for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))
    return usec / calls, calls / elapsed


def measure(size: int, tasks: int, folder: Path) -> dict:
    server = RedisServer(folder / f"redis-{size}").start()
    try:
        client = redis.Redis.from_url(server.url)
        table = Table(client)
        for n in range(size):
            table.register(
                f"e{n}",
                MODEL,
                worker="fleet",
                max_batch=32,
                ttl_ms=600_000,
                max_wait_ms=5.0,
                pid=0,
            )
        busy_us, busy_rate = route_cost(client, table, tasks)
        client.delete(*keys.l1_keys(MODEL))
        assert table.claim_or_idle("e0", MODEL, 32) is None
        idle_us, idle_rate = route_cost(client, table, tasks)
        client.close()
    finally:
        server.stop()
    return {
        "executors": size,
        "all_busy_us_per_route": round(busy_us, 1),
        "all_busy_routes_per_s": round(busy_rate),
        "one_idle_us_per_route": round(idle_us, 1),
        "one_idle_routes_per_s": round(idle_rate),
    }


def path_cost(tasks: int, folder: Path) -> dict:
    """One worker serving sim at zero cost; a burst of `tasks` through the whole path (route,
    claim, store, metrics, events). Redis CPU per task, and scripts run per batch."""
    settings = load_settings(models=(MODEL,), sim_base_ms=0.0, sim_per_item_ms=0.0)
    with Stack(settings, workers=1, data_dir=folder) as stack, Client(settings=stack.settings) as c:
        client = redis.Redis.from_url(stack.url)
        c.submit(MODEL, [0]).get(timeout=10)
        time.sleep(2 * settings.heartbeat_s)  # a heartbeat has seen no revocations
        (before,) = c.table.executors(MODEL)
        client.config_resetstat()
        c.submit_many(MODEL, [[n] for n in range(tasks)])
        deadline = time.monotonic() + 120
        while c.table.executors(MODEL)[0].tasks < before.tasks + tasks:
            if time.monotonic() > deadline:
                raise TimeoutError("the burst did not finish in 120 s")
            time.sleep(0.01)  # polling a counter, bounded by the deadline
        (after,) = c.table.executors(MODEL)
        stats = client.info("commandstats")
        client.close()
    batches = after.batches - before.batches
    scripts = sum(v["calls"] for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval"))
    script_checks = stats.get("cmdstat_script", {}).get("calls", 0)  # SCRIPT EXISTS/LOAD
    return {
        "tasks": tasks,
        "batches": batches,
        "redis_cpu_us_per_task": round(sum(v["usec"] for v in stats.values()) / tasks, 1),
        "executor_scripts_per_batch": round((scripts - tasks) / batches, 2),  # less the routes
        "script_checks_per_batch": round(script_checks / batches, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,32,256,1024")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--path", action="store_true", help="The whole path's cost instead.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if args.path:
            print(path_cost(6400, Path(folder)), flush=True)
            return
        for size in [int(s) for s in args.sizes.split(",")]:
            print(measure(size, args.tasks, Path(folder)), flush=True)


if __name__ == "__main__":
    main()
