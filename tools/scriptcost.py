"""`python -m tandem.tools.scriptcost`: Redis's own time per task in each script on a
task's path, from SLOWLOG at 0 µs on a Redis of its own, one client, no workers: the
route of 256 tasks, claim_or_idle of 32, complete.lua with the results, and count.lua
once per block of 40 batches with their bookkeeping (their metrics counters, the model's
histograms among them), as an executor at saturation sends it every 0.25 s. What the
overhead profile's Redis CPU measures too, without the scheduling around it.

`--backlog N,...`: claim_or_idle's time per claim of 32 from an L1 that already holds N
messages, pushed one at a time among other keys as a live Redis allocates them, so the
list's nodes lie scattered in memory: what a claim costs while a backlog drains."""

from __future__ import annotations

import argparse
import random
import tempfile
from collections import Counter
from pathlib import Path

import redis

from tandem.broker import keys, message, metrics, results
from tandem.broker.settings import Settings
from tandem.broker.table import Table
from tandem.server import RedisServer

MODEL, BATCH, ROUTE, BLOCK = "sim:1", 32, 256, 40


def counters(rng: random.Random) -> Counter:
    """A batch's counters, as workers/hooks.py Metrics makes them."""
    c: Counter = Counter()
    metrics.observe(c, "batch_size", BATCH)
    metrics.observe(c, "compute_ms", rng.uniform(15, 25))
    c["outcome:SUCCESS"] += BATCH
    c["deadline:met"] += BATCH
    for _ in range(BATCH):
        metrics.observe(c, "latency_ms", rng.lognormvariate(4, 1))
        metrics.observe(c, "queue_wait_ms", rng.lognormvariate(3, 1))
    return c


def run(rounds: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="tandem-scriptcost-") as folder:
        server = RedisServer(Path(folder) / "redis").start()
        try:
            return _measure(redis.Redis.from_url(server.url), rounds)
        finally:
            server.stop()


def _measure(r: redis.Redis, rounds: int) -> dict:
    r.config_set("slowlog-log-slower-than", 0)
    r.config_set("slowlog-max-len", 100000)
    table = Table(r, Settings(result_expires_s=60))
    table.register("a", MODEL, worker="w", max_batch=BATCH, ttl_ms=10**8, max_wait_ms=0.0, pid=1)
    names = {
        getattr(table.scripts, name).sha.encode(): name
        for name in ("route", "claim_or_idle", "complete", "count")
    }
    rng = random.Random(1)
    spent: Counter = Counter()
    tasks = 0
    for n in range(rounds + 1):  # the first round warms the hashes up, unmeasured
        r.slowlog_reset()
        owed: Counter = Counter()
        for start in range(0, BLOCK * BATCH, ROUTE):
            ids = _route(table, start)
            for at in range(0, ROUTE, BATCH):
                table.complete("a", _claim(table, ids[at : at + BATCH]), model=MODEL)
                owed.update(counters(rng))
        table.count_batch("a", MODEL, BLOCK * BATCH, batches=BLOCK, counters=owed)
        if n:
            tasks += BLOCK * BATCH
            for entry in r.slowlog_get(100000):
                name = names.get((entry["command"].split() + [b"", b""])[1])
                if name:
                    spent[name] += entry["duration"]
    return {
        "rounds": rounds,
        "tasks": tasks,
        "metrics_fields": r.hlen(keys.metrics(MODEL)),
        "us_per_task": {name: round(us / tasks, 2) for name, us in sorted(spent.items())}
        | {"all": round(sum(spent.values()) / tasks, 2)},
    }


def backlog(lengths: list[int], claims: int = 100) -> dict[int, float]:
    """µs of Redis's time per claim of BATCH from an L1 of each length (see the module)."""
    found = {}
    with tempfile.TemporaryDirectory(prefix="tandem-scriptcost-") as folder:
        server = RedisServer(Path(folder) / "redis").start()
        try:
            r = redis.Redis.from_url(server.url)
            table = Table(r, Settings(result_expires_s=60))
            _, raw = message.encode(MODEL, [0], queue=keys.l1(MODEL))
            rng = random.Random(1)
            for length in lengths:
                r.flushdb()  # each length on an empty Redis, its executor registered anew
                table.register(
                    "a", MODEL, worker="w", max_batch=BATCH, ttl_ms=10**8, max_wait_ms=0.0, pid=1
                )
                pipe = r.pipeline(transaction=False)
                for n in range(length + claims * BATCH):
                    pipe.lpush(keys.l1(MODEL), raw)
                    pipe.set(f"filler:{n}", b"x" * rng.randint(100, 2000))
                    if n % 1000 == 999:
                        pipe.execute()
                pipe.execute()
                r.config_set("slowlog-log-slower-than", 0)
                r.slowlog_reset()
                for _ in range(claims):
                    assert len(table.claim_or_idle("a", MODEL, BATCH) or ()) == BATCH
                    r.delete(keys.inflight("a"))
                sha = table.scripts.claim_or_idle.sha.encode()
                spent = [e["duration"] for e in r.slowlog_get(10 * claims) if sha in e["command"]]
                r.config_set("slowlog-log-slower-than", 10_000)
                found[length] = round(sum(spent) / len(spent), 1)
        finally:
            server.stop()
    return found


def _route(table: Table, start: int) -> list[str]:
    encoded = [message.encode(MODEL, [start + n], queue=keys.l1(MODEL)) for n in range(ROUTE)]
    table.route_many(MODEL, [envelope for _, envelope in encoded])
    return [task_id for task_id, _ in encoded]


def _claim(table: Table, ids: list[str]) -> list[tuple[bytes, str, str]]:
    batch = table.claim_or_idle("a", MODEL, BATCH)
    assert batch is not None and len(batch) == len(ids)
    by_id = {message.decode(raw, max_bytes=1 << 20).id: raw for raw in batch}
    return [(by_id[i], keys.result(i), results.success(i, [n])) for n, i in enumerate(ids)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="Blocks of 40 batches.")
    parser.add_argument(
        "--backlog", default="100,10000,100000", help="L1 lengths to time a claim at ('' none)."
    )
    args = parser.parse_args()
    found = run(args.rounds)
    spent = ", ".join(f"{k} {v} us" for k, v in found["us_per_task"].items())
    print(f"{found['tasks']} tasks; the metrics hash: {found['metrics_fields']} fields")
    print(f"per task: {spent}")
    lengths = [int(n) for n in args.backlog.split(",") if n]
    for length, us in backlog(lengths).items():
        print(f"a claim of {BATCH} from an L1 of {length:,}: {us} us")


if __name__ == "__main__":
    main()
