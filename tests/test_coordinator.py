"""The coordinator: reclaiming dead executors and relaying state changes."""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import wait_until
from tandem.broker import deadletter, keys, message
from tandem.broker.table import Table
from tandem.coordinator.service import Coordinator, state_change

MODEL = "m:1"


def test_sweep_reclaims_only_executors_whose_heartbeat_lapsed(settings, r):
    table = Table(r)
    table.register("dead", MODEL, worker="w", max_batch=4, ttl_ms=200, max_wait_ms=0, pid=1)
    table.register("live", MODEL, worker="w", max_batch=4, ttl_ms=60_000, max_wait_ms=0, pid=1)
    task_id, envelope = message.encode(MODEL, [1], queue=keys.l1(MODEL))
    table.route(MODEL, envelope)
    table.claim("dead", MODEL, 4)
    coordinator = Coordinator(settings, r)
    reclaimed = wait_until(coordinator.sweep, 10, "the dead executor reclaimed")
    assert reclaimed == [("dead", 1)]
    assert table.executor_ids(MODEL) == ["live"]
    # It died holding the task: one delivery, and the task waits to be computed alone.
    assert table.l1_depth(MODEL) == 0
    assert r.lrange(keys.retry(MODEL), 0, -1) == [envelope.encode()]
    assert r.lrange(keys.deliveries(envelope.encode()), 0, -1) == [b"dead"]
    assert coordinator.sweep() == []


def test_a_sweep_reads_only_lapsed_deadlines_and_drops_ids_without_a_hash(settings, r):
    table = Table(r)
    for n in range(50):
        table.register(f"e{n}", MODEL, worker="w", max_batch=4, ttl_ms=60_000, max_wait_ms=0, pid=1)
    r.zadd(keys.DEADLINES, {"ghost": 1})  # its hash is gone
    coordinator = Coordinator(settings, r)
    r.config_resetstat()
    assert coordinator.sweep() == []
    calls = r.info("commandstats")
    assert "cmdstat_hgetall" not in calls  # no executor was read
    assert r.zscore(keys.DEADLINES, "ghost") is None
    assert r.zcard(keys.DEADLINES) == 50
    assert coordinator.sweep(full=True) == []  # the full sweep reads them, and keeps them


def test_feed_hands_l1_tasks_to_ready_executors_highest_priority_first(settings, r):
    """Tasks that skipped the route (a plain Celery publisher's LPUSH) reach idle
    executors through feed, each within its capacity, the rest stay in L1."""
    table = Table(r)
    table.register("a", MODEL, worker="w", max_batch=2, ttl_ms=60_000, max_wait_ms=5, pid=1)
    assert table.feed([MODEL]) == 0  # no executor ready: a ZCARD
    sent = {}
    for n, priority in enumerate([0, 9, 0, 3]):
        task_id, envelope = message.encode(MODEL, [n], queue=keys.l1(MODEL), priority=priority)
        r.lpush(keys.l1_for_priority(MODEL, priority), envelope)
        sent[priority, n] = task_id
    assert table.feed([MODEL]) == 0  # "a" is WORKING
    assert table.claim_or_idle("a", MODEL, 2) is not None  # it claims the two first ...
    assert table.claim_or_idle("a", MODEL, 2) is not None
    assert table.claim_or_idle("a", MODEL, 2) is None  # ... then L1 is empty: IDLE
    for n, priority in enumerate([3, 0, 9]):
        task_id, envelope = message.encode(MODEL, [n], queue=keys.l1(MODEL), priority=priority)
        r.lpush(keys.l1_for_priority(MODEL, priority), envelope)
        sent[priority, 10 + n] = task_id
    assert table.feed([MODEL]) == 2
    in_l2 = [json.loads(m)["headers"]["id"] for m in reversed(r.lrange(keys.l2("a"), 0, -1))]
    assert in_l2 == [sent[0, 11], sent[3, 10]]
    assert table.l1_depth(MODEL) == 1
    assert r.hget(keys.executor("a"), "cap") == b"0"


def test_feed_serves_every_model_at_once_and_after_its_script_is_flushed(settings, r):
    """One call feeds every model named; a Redis that lost its scripts (a restart, SCRIPT
    FLUSH) gets feed.lua again, and nothing is handed twice."""
    table = Table(r)
    models = [f"sim:{n}" for n in range(1, 5)]
    for n, model in enumerate(models):
        table.register(model, model, worker="w", max_batch=4, ttl_ms=60_000, max_wait_ms=5, pid=1)
        assert table.claim_or_idle(model, model, 4) is None  # IDLE: ready for L2
        for item in range(n + 1):
            r.lpush(keys.l1(model), message.encode(model, [item], queue=keys.l1(model))[1])
    r.script_flush()
    assert table.feed(models) == 1 + 2 + 3 + 4
    assert [r.llen(keys.l2(m)) for m in models] == [1, 2, 3, 4]
    assert table.feed(models) == 0 and sum(table.l1_depth(m) for m in models) == 0


def test_a_task_that_takes_down_max_deliveries_executors_is_buried(settings, r):
    table = Table(r, settings)
    coordinator = Coordinator(settings, r)
    task_id, poison = message.encode(MODEL, [1], queue=keys.l1(MODEL))
    other_id, other = message.encode(MODEL, [2], queue=keys.l1(MODEL))
    # A busy (WORKING) executor makes the model known; routes then go to L1.
    table.register("busy", MODEL, worker="w", max_batch=4, ttl_ms=60_000, max_wait_ms=0, pid=1)
    table.route(MODEL, poison)
    table.route(MODEL, other)
    for n in range(settings.max_deliveries):
        victim = f"victim{n}"
        table.register(victim, MODEL, worker="w", max_batch=4, ttl_ms=1, max_wait_ms=0, pid=1)
        # As an executor does: a batch taken alone from the retry list, else from L1.
        while poison.encode() not in (batch := table.claim(victim, MODEL, 4, alone=True)):
            assert batch == [other.encode()], "a redelivered task is computed alone"
            table.complete(victim, [(batch[0], keys.result(other_id), '{"status": "SUCCESS"}')])
        assert len(batch) == (2 if n == 0 else 1)
        wait_until(lambda v=victim: (v, len(batch)) in coordinator.sweep(), 10, "a reclaim")
    meta = json.loads(r.get(keys.result(task_id)))
    assert meta["status"] == "FAILURE"
    assert meta["result"]["exc_type"] == "PoisonMessage"
    reason = meta["result"]["exc_message"][0]
    assert all(f"victim{n}" in reason for n in range(settings.max_deliveries)), reason
    (letter,) = deadletter.read(r)
    assert (letter.id, letter.model, letter.raw) == (task_id, MODEL, poison.encode())
    assert letter.executors == tuple(f"victim{n}" for n in range(settings.max_deliveries))
    assert letter.reason.startswith("PoisonMessage: ")
    assert r.llen(keys.POISON) == 0 and not r.exists(keys.deliveries(poison.encode()))
    # The task that went down with it the first time is computed alone, and kept.
    while batch := table.claim("busy", MODEL, 4, alone=True):
        assert batch == [other.encode()]
        table.complete("busy", [(batch[0], keys.result(other_id), '{"status": "SUCCESS"}')])
    assert json.loads(r.get(keys.result(other_id)))["status"] == "SUCCESS"
    assert r.lrange(keys.deliveries(other.encode()), 0, -1) == [b"victim0"]
    assert r.llen(keys.retry(MODEL)) == 0
    assert coordinator.bury() == 0


@pytest.fixture
def relaying(settings, r):
    """A coordinator relaying from now, a subscriber to the state channel, and executor
    "a" registered (its WORKING change is the first to relay)."""
    coordinator = Coordinator(settings, r)
    coordinator.relay()  # start from now
    pubsub = r.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.STATE_CHANNEL)
    Table(r).register("a", MODEL, worker="w", max_batch=4, ttl_ms=60_000, max_wait_ms=0, pid=1)
    yield coordinator, pubsub
    pubsub.close()


def published(pubsub, n: int) -> list[dict]:
    return [
        json.loads(wait_until(lambda: pubsub.get_message(timeout=1), 10)["data"]) for _ in range(n)
    ]


def test_relay_publishes_every_change_in_order(relaying, r):
    coordinator, pubsub = relaying
    table = Table(r)
    table.claim_or_idle("a", MODEL, 4)
    table.reclaim("a", MODEL, force=True)
    assert coordinator.relay() == 3
    changes = published(pubsub, 3)
    assert [(c["executor"], c["model"], c["state"]) for c in changes] == [
        ("a", MODEL, "WORKING"),
        ("a", MODEL, "IDLE"),
        ("a", MODEL, "GONE"),
    ]


def test_a_hostile_state_change_is_dropped_and_the_rest_relayed(relaying, r):
    """Bytes in the stream that no script writes (not UTF-8, a non-integer ms) are dropped
    with a warning; the changes around them are relayed and the relay moves past them."""
    coordinator, pubsub = relaying
    r.xadd(keys.STATE_STREAM, {b"executor": b"\xff\xfe", b"state": b"IDLE"})
    r.xadd(keys.STATE_STREAM, {b"executor": b"b", b"ms": b"soon"})
    Table(r).reclaim("a", MODEL, force=True)
    assert coordinator.relay() == 2
    assert coordinator.relay() == 0
    assert [c["state"] for c in published(pubsub, 2)] == ["WORKING", "GONE"]


@given(st.dictionaries(st.binary(max_size=12), st.binary(max_size=12), max_size=6))
def test_state_change_takes_any_fields(fields):
    change = state_change(fields)
    if change is not None:
        assert isinstance(change["ms"], int)
        assert all(isinstance(k, str) for k in change)
        json.dumps(change)


def test_run_stops_cleanly(settings, r):
    coordinator = Coordinator(settings.replace(coordinator_interval_s=0.05), r)
    thread = threading.Thread(target=coordinator.run)
    thread.start()
    Table(r).register("a", MODEL, worker="w", max_batch=4, ttl_ms=100, max_wait_ms=0, pid=1)
    wait_until(lambda: coordinator.reclaimed == 1, 10, "a reclaim from the running loop")
    coordinator.stop()
    thread.join(5)
    assert not thread.is_alive()


def test_a_second_coordinator_says_so_and_stands_by_until_the_first_is_gone(processes, r):
    """One coordinator works per Redis. Another stands by, with a warning, and takes over
    at once when the first stops, and within the lease's time when it is killed."""
    log = processes.logs / "coordinator.log"
    first = processes.coordinator()
    wait_until(lambda: "holds the lease" in log.read_text(), 20, "the first to lead")
    second = processes.coordinator()  # the same log file: each line names its pid
    wait_until(lambda: "stands by" in log.read_text(), 20, "the second to stand by")
    holder = r.get(keys.COORDINATOR).decode()
    assert holder.split(":")[1] == str(first.pid)
    first.terminate()  # it gives the lease up as it stops
    first.wait(20)
    wait_until(lambda: holds(r, second), 10, "a takeover")
    third = processes.coordinator()
    wait_until(lambda: log.read_text().count("stands by") >= 2, 20, "the third to stand by")
    second.kill()  # no goodbye: its lease lapses
    wait_until(lambda: holds(r, third), 20, "a takeover")
    # The one working now does the work: a dead executor is reclaimed.
    table = Table(r)
    table.register("dead", MODEL, worker="w", max_batch=4, ttl_ms=100, max_wait_ms=0, pid=1)
    wait_until(lambda: table.executor_ids(MODEL) == [], 10, "the dead executor reclaimed")


def holds(r, process) -> bool:
    """True if the coordinator process holds the lease ("host:pid:token")."""
    holder = (r.get(keys.COORDINATOR) or b"::").decode()
    return holder.split(":")[1] == str(process.pid)


def test_the_lease_is_taken_kept_and_given_up_only_by_its_holder(r):
    table = Table(r)
    assert table.lease("a", 10_000) == "a"
    assert table.lease("b", 10_000) == "a"  # held: b stands by
    assert table.lease("b", 0) == "a"  # b cannot give up a's lease
    assert table.lease("a", 10_000) == "a" and r.pttl(keys.COORDINATOR) > 9_000
    assert table.lease("a", 0) == ""
    assert table.lease("b", 10_000) == "b"
    r.delete(keys.COORDINATOR)
    r.rpush(keys.COORDINATOR, "junk")  # another type: set aside, and taken
    assert table.lease("c", 10_000) == "c"
    assert r.type(keys.COORDINATOR + ":wrongtype") == b"list"
