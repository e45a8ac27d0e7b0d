"""The fleet's size, measured on real workers and Redis: the coordinator's signal sees
the whole offered demand (the refused too), wants what the formula gives, asks for an
executor where tasks wait and none runs, and is served to Prometheus and `tandem
status`. A worker stopped in a burst loses and delays nothing."""

from __future__ import annotations

import json
import math
import signal
import time

import pytest
from test_operations import scrape, value

from helpers import tandem, wait_until
from tandem.broker import keys
from tandem.broker.errors import Overloaded
from tandem.broker.table import Table
from tandem.coordinator.exporter import serve
from tandem.coordinator.service import Coordinator
from tandem.producers.client import Client
from tandem.server import free_port

#: sim at 100 ms a batch of at most 4, whatever its size: about 40 tasks/s an executor.
SLOW = {"sim_base_ms": 100.0, "sim_per_item_ms": 0.0, "max_batch": 4, "slo_ms": 2000.0}


def offer(client: Client, coordinator: Coordinator, rate: float, seconds: float) -> dict:
    """Submit `rate` tasks/s (in bursts every 0.1 s, each with a 0.5 s deadline) for
    `seconds`, measuring the coordinator's signal every 0.5 s. Counts what was sent and
    refused."""
    sent = refused = 0
    start = next_scale = time.monotonic()
    while (now := time.monotonic()) - start < seconds:
        due = int((now - start) * rate) - sent
        if due > 0:
            try:
                client.submit_many("sim:1", [[n] for n in range(due)], deadline_s=0.5)
            except Overloaded as e:
                refused += due - len(e.accepted)
            sent += due
        if now >= next_scale:
            coordinator.scale()
            next_scale = now + 0.5
        time.sleep(0.05)  # pacing the offered load, not synchronisation
    return {"sent": sent, "refused": refused, "seconds": time.monotonic() - start}


def test_a_flood_mostly_refused_still_raises_the_signal_by_the_formula(processes, settings, r):
    processes.worker("w1", **SLOW)
    coordinator = Coordinator(settings.replace(scale_headroom=0.15), r)
    with Client(settings=settings) as client:
        client.submit_many("sim:1", [[n] for n in range(8)])  # a measured rate first
        wait_until(lambda: Table(r).speed("sim:1"), 20, "a published speed")
        load = offer(client, coordinator, rate=200, seconds=12)
    reading = coordinator.scale()["sim:1"]
    # Most of the flood was refused at submit, so L1 stayed short ...
    assert load["refused"] > load["sent"] / 2 and Table(r).l1_depth("sim:1") < 40
    # ... yet the offered rate is all of it, and the capacity one executor's at the SLO.
    assert reading.offered_rps == pytest.approx(load["sent"] / load["seconds"], rel=0.3)
    assert reading.capacity_rps == pytest.approx(40, rel=0.3)
    assert reading.wanted == math.ceil(reading.offered_rps * 1.15 / reading.capacity_rps)
    assert reading.wanted >= 4 and reading.running == 1
    published = Table(r).scale("sim:1")
    assert published["wanted"] == reading.wanted and published["running"] == 1


def test_waiting_tasks_and_no_executor_ask_for_one(processes, settings, r):
    worker = processes.worker("gone", models=("sim:4",))
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    coordinator = Coordinator(settings, r)
    assert coordinator.scale()["sim:4"].wanted == 0  # nothing offered, nothing waits
    with Client(settings=settings) as client:
        client.submit("sim:4", [1])  # no deadline: it waits in L1 for a worker
    reading = coordinator.scale()["sim:4"]
    assert (reading.wanted, reading.running) == (1, 0)


def test_the_signal_is_in_prometheus_and_in_status(processes, settings, r):
    processes.worker("w1")
    coordinator = Coordinator(settings, r)
    port = free_port()
    serve(r, port, address="127.0.0.1")
    with Client(settings=settings) as client:
        for _ in range(3):
            client.submit_many("sim:1", [[k] for k in range(20)])[-1].get(timeout=10)
            coordinator.scale()
    # The latency model is published with the batches' bookkeeping, after their results.
    wait_until(lambda: Table(r).speed("sim:1"), 10, "a published speed")
    coordinator.scale()
    samples = scrape(port)
    for name in ("executors_wanted", "offered_rate", "capacity_per_executor"):
        assert (f"tandem_{name}", (("model", "sim:1"),)) in samples, name
    assert value(samples, "tandem_executors_wanted", model="sim:1") == 1
    assert value(samples, "tandem_capacity_per_executor", model="sim:1") > 0
    done = tandem("status", "--json", redis_url=settings.redis_url)
    (queue,) = json.loads(done.stdout)["queues"]
    assert queue["executors_wanted"] == 1 and queue["offered_rps"] > 0
    assert queue["capacity_per_executor_rps"] > 0
    assert "wanted" in tandem("status", redis_url=settings.redis_url).stdout


def test_a_worker_stopped_in_a_burst_answers_every_task_once_and_in_time(processes, settings, r):
    """Scale-in: SIGTERM to one of two workers mid-burst. It takes nothing more, finishes
    or hands back what it holds; every task is answered once, none after its deadline."""
    leaving = processes.worker("w1", sim_base_ms=30.0)
    processes.worker("w2", sim_base_ms=30.0)
    with Client(settings=settings) as client:
        results = client.submit_many("sim:1", [[n] for n in range(1500)], deadline_s=60)
        wait_until(results[0].ready, 20, "the burst under way")
        leaving.send_signal(signal.SIGTERM)
        assert leaving.wait(60) == 0
        assert [res.get(timeout=60) for res in results] == [[n] for n in range(1500)]
    # The leaving worker counted what it owed before it exited; w2 counts after its results.
    wait_until(lambda: Table(r).counters("sim:1").get("outcome:SUCCESS") == 1500, 10, "the counts")
    counters = Table(r).counters("sim:1")
    assert not counters.get("outcome:FAILURE")
    assert counters.get("deadline:met") == 1500
    assert Table(r).stats().get("duplicates", 0) == 0
    assert r.exists(keys.scale("sim:1")) == 0  # no coordinator ran: nothing was published
