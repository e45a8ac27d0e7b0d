"""The scheduling invariants, under concurrent routing, claiming and going idle.

Real executors (threads here, the same code the worker runs) and real
producers hit a real Redis while a checker snapshots the executor table
atomically (MULTI/EXEC) and records every violation it sees.
"""

from __future__ import annotations

import json
import random
import threading
import time

import pytest

from helpers import wait_until
from tandem.broker import keys
from tandem.broker.state import State
from tandem.broker.table import Table
from tandem.producers.client import Client
from tandem.workers.executor import Executor
from tandem.workers.heartbeat import Heartbeat
from tandem.workers.models.sim import SimModel

MODEL = "sim:1"
MAX_BATCH = 4


class Checker(threading.Thread):
    """Snapshots executors and L1 atomically, again and again, and keeps the violations."""

    def __init__(self, table: Table, executor_ids: list[str]) -> None:
        super().__init__(daemon=True)
        self.table = table
        self.ids = executor_ids
        self.snapshots = 0
        self.lost_wakeups: list[str] = []
        self.l2_breaches: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.check(*self.snapshot())

    def snapshot(self) -> tuple[int, list]:
        with self.table.redis.pipeline(transaction=True) as pipe:
            for key in keys.l1_keys(MODEL):
                pipe.llen(key)
            for executor_id in self.ids:
                pipe.hmget(keys.executor(executor_id), "state", "cap", "max_batch", "max_wait_ms")
                pipe.llen(keys.l2(executor_id))
            replies = pipe.execute()
        n = len(keys.l1_keys(MODEL))
        rows = [(replies[i], replies[i + 1]) for i in range(n, len(replies), 2)]
        return sum(replies[:n]), rows

    def check(self, l1_depth: int, rows: list) -> None:
        self.snapshots += 1
        for (state, cap, max_batch, max_wait_ms), l2_depth in rows:
            if state is None:
                continue
            state, cap, max_batch = state.decode(), int(cap), int(max_batch)
            if l1_depth and state == State.IDLE and cap > 0:
                self.lost_wakeups.append(f"L1={l1_depth} while IDLE cap={cap}")
            # Without a window, the one routed task makes its executor WORKING at once
            # and sits in L2 until the executor pops it; nothing more may join it.
            allowed = 1 if float(max_wait_ms) == 0 else 0
            if state == State.WORKING and l2_depth > allowed:
                self.l2_breaches.append(f"L2={l2_depth} while WORKING")
            if l2_depth + cap > max_batch:
                self.l2_breaches.append(f"L2={l2_depth} + cap={cap} > {max_batch}")


class RacyExecutor(Executor):
    """Goes idle by check-then-set, the non-atomic way the scripts exist to prevent."""

    def _claim_or_idle(self) -> list[bytes]:
        r = self.table.redis
        while True:
            if self.table.l1_depth(self.model_ref) == 0:
                time.sleep(0.002)  # widens the race window on purpose
                r.hset(keys.executor(self.id), mapping={"state": "IDLE", "cap": self.max_batch})
                self.state = State.IDLE
                return []
            held = self.table.claim(self.id, self.model_ref, self.max_batch)
            if held:
                return held


def register_fleet(table: Table, size: int) -> None:
    """`size` more executors of the model that can never take a task: half WORKING, half
    IDLE with a lapsed heartbeat (in the ready set until a route drops them)."""
    for n in range(size):
        fake = f"fleet{n}"
        lapsed = n % 2 == 1
        table.register(
            fake,
            MODEL,
            worker="fleet",
            max_batch=MAX_BATCH,
            ttl_ms=-1 if lapsed else 600_000,
            max_wait_ms=0.0,
            pid=0,
        )
        if lapsed:
            assert table.claim_or_idle(fake, MODEL, MAX_BATCH) is None


def run_load(settings, r, executor_class=Executor, tasks_per_producer: int = 150, fleet=0):
    settings = settings.replace(max_batch=MAX_BATCH, poll_ms=20.0)
    table = Table(r)
    register_fleet(table, fleet)
    executors = [
        executor_class(
            MODEL,
            SimModel(base_ms=2, per_item_ms=0.2),
            table=table,
            settings=settings.replace(max_wait_ms=wait),
            worker=f"t{n}",
        )
        for n, wait in enumerate((0.0, 0.0, 3.0))
    ]
    for executor in executors:
        executor.start()
    heartbeat = Heartbeat(table, executors, interval_s=0.2, ttl_s=5).start()
    wait_until(lambda: all(e.state == State.IDLE for e in executors), 10, "executors IDLE")
    checker = Checker(table, [e.id for e in executors])
    checker.start()
    client = Client(settings=settings)
    submitted: dict[str, int] = {}
    lock = threading.Lock()

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        for n in range(tasks_per_producer):
            value = seed * 10_000 + n
            result = client.submit(MODEL, [value])
            with lock:
                submitted[result.id] = value
            if rng.random() < 0.3:
                time.sleep(rng.random() * 0.01)  # shapes the load into bursts and lulls

    producers = [threading.Thread(target=produce, args=(seed,)) for seed in range(4)]
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join()
    result_keys = [keys.result(t) for t in submitted]
    wait_until(lambda: r.exists(*result_keys) == len(result_keys), 60, "every result")
    checker.stop.set()
    checker.join()
    heartbeat.stop()
    for executor in executors:
        executor.stop()
    client.close()
    return checker, submitted, executors


@pytest.mark.parametrize("fleet", [0, 1000])
def test_no_lost_wakeup_and_l2_stays_in_bounds(settings, r, fleet):
    """fleet: as many other executors registered, none able to take a task."""
    checker, submitted, executors = run_load(settings, r, fleet=fleet)
    assert checker.snapshots > 100
    assert checker.lost_wakeups == []
    assert checker.l2_breaches == []
    for task_id, value in submitted.items():
        meta = json.loads(r.get(keys.result(task_id)))
        assert (meta["status"], meta["result"]) == ("SUCCESS", [value])
    assert sum(e.tasks for e in executors) == len(submitted)
    assert r.zcard(keys.ready(MODEL)) <= len(executors)  # every lapsed entry was dropped


def test_the_checker_catches_a_non_atomic_go_idle(settings, r):
    """The invariant test can fail: check-then-set going idle strands tasks in L1."""
    checker, _, _ = run_load(settings, r, executor_class=RacyExecutor)
    assert checker.lost_wakeups, f"no violation seen in {checker.snapshots} snapshots"


@pytest.mark.parametrize("max_wait_ms", [0.0, 30.0])
def test_every_task_is_computed_exactly_once_without_reclaims(settings, r, max_wait_ms):
    settings = settings.replace(max_wait_ms=max_wait_ms)
    checker, submitted, executors = run_load(settings, r, tasks_per_producer=50)
    assert sum(e.tasks for e in executors) == len(submitted) == 200
    assert r.llen(keys.DEAD) == 0
