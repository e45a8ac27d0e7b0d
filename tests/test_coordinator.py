"""The coordinator: reclaiming dead executors and relaying state changes."""

from __future__ import annotations

import json
import threading

from broker import keys, message
from broker.coordinator import Coordinator
from broker.table import Table
from helpers import wait_until

MODEL = "m:1"


def test_sweep_reclaims_only_executors_whose_heartbeat_lapsed(settings, r):
    table = Table(r)
    table.register("dead", MODEL, worker="w", max_batch=4, ttl_ms=200, max_wait_ms=0, pid=1)
    table.register("live", MODEL, worker="w", max_batch=4, ttl_ms=60_000, max_wait_ms=0, pid=1)
    task_id, envelope = message.encode(MODEL, [1], queue=keys.l1(MODEL))
    table.route(MODEL, envelope, l1_key=keys.l1(MODEL))
    table.claim("dead", MODEL, 4)
    coordinator = Coordinator(settings, r)
    reclaimed = wait_until(coordinator.sweep, 10, "the dead executor reclaimed")
    assert reclaimed == [("dead", 1)]
    assert table.executor_ids(MODEL) == ["live"]
    assert table.l1_depth(MODEL) == 1
    assert coordinator.sweep() == []


def test_relay_publishes_every_change_in_order(settings, r):
    table = Table(r)
    coordinator = Coordinator(settings, r)
    coordinator.relay()  # start from now
    pubsub = r.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.CHANNEL)
    table.register("a", MODEL, worker="w", max_batch=4, ttl_ms=60_000, max_wait_ms=0, pid=1)
    table.go_idle("a", MODEL, 4)
    table.reclaim("a", MODEL, force=True)
    assert coordinator.relay() == 3
    changes = [
        json.loads(wait_until(lambda: pubsub.get_message(timeout=1), 10)["data"]) for _ in range(3)
    ]
    assert [(c["executor"], c["model"], c["state"]) for c in changes] == [
        ("a", MODEL, "WORKING"),
        ("a", MODEL, "IDLE"),
        ("a", MODEL, "GONE"),
    ]
    pubsub.close()


def test_run_stops_cleanly(settings, r):
    coordinator = Coordinator(settings.replace(coordinator_interval_s=0.05), r)
    thread = threading.Thread(target=coordinator.run)
    thread.start()
    Table(r).register("a", MODEL, worker="w", max_batch=4, ttl_ms=100, max_wait_ms=0, pid=1)
    wait_until(lambda: coordinator.reclaimed == 1, 10, "a reclaim from the running loop")
    coordinator.stop()
    thread.join(5)
    assert not thread.is_alive()
