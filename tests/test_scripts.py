"""The atomic scripts, called directly on a real Redis."""

from __future__ import annotations

import json
import re
import time
from importlib import resources

import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tandem.broker import deadletter, keys, message, results, scripts
from tandem.broker.errors import ExecutorGone, QueueFull, TandemError, UnknownModel
from tandem.broker.settings import Settings
from tandem.broker.state import Speed, State
from tandem.broker.table import Table

MODEL = "m:1"


@pytest.fixture
def table(r) -> Table:
    return Table(r, Settings(result_expires_s=60))


def register(
    table: Table,
    executor_id: str,
    max_batch: int = 4,
    ttl_ms: int = 60_000,
    max_wait_ms: float = 5.0,
) -> None:
    table.register(
        executor_id,
        MODEL,
        worker="w",
        max_batch=max_batch,
        ttl_ms=ttl_ms,
        max_wait_ms=max_wait_ms,
        pid=1,
    )


def idle(table: Table, executor_id: str, max_batch: int = 4) -> None:
    assert table.claim_or_idle(executor_id, MODEL, max_batch) is None


def route(table: Table, n: int, priority: int = 0) -> tuple[str, str | None]:
    task_id, envelope = message.encode(MODEL, [n], queue=keys.l1(MODEL), priority=priority)
    return task_id, table.route(MODEL, envelope, priority=priority)


def ids_in(r, key: str) -> list[str]:
    """Task ids in a list, in the order consumers pop them (right end first)."""
    return [json.loads(m)["headers"]["id"] for m in reversed(r.lrange(key, 0, -1))]


def test_unknown_model_is_refused_and_nothing_is_enqueued(table, r):
    with pytest.raises(UnknownModel, match="no worker serves m:1"):
        route(table, 0)
    assert r.dbsize() == 0


def test_route_fills_an_idle_executor_up_to_its_capacity_then_l1(table, r):
    register(table, "a")
    idle(table, "a")
    routes = [route(table, n)[1] for n in range(6)]
    assert routes == ["a"] * 4 + [None] * 2
    assert r.llen(keys.l2("a")) == 4
    assert r.hget(keys.executor("a"), "cap") == b"0"
    assert table.l1_depth(MODEL) == 2


def test_without_a_batch_window_the_routed_task_makes_the_executor_working(table, r):
    register(table, "a", max_wait_ms=0)
    idle(table, "a")
    assert [route(table, n)[1] for n in range(3)] == ["a", None, None]
    assert r.hmget(keys.executor("a"), "state", "cap") == [b"WORKING", b"0"]
    assert r.llen(keys.l2("a")) == 1


def changes_of(r, executor_id: str) -> list[tuple[str, int]]:
    """The executor's records in the changes stream: (state, ms), oldest first."""
    return [
        (fields[b"state"].decode(), int(fields[b"ms"]))
        for _, fields in r.xrange(keys.STATE_STREAM)
        if fields[b"executor"] == executor_id.encode()
    ]


def routed_to_l2(r) -> int:
    return int(r.hget(keys.metrics(MODEL), "route:L2") or 0)


@pytest.mark.parametrize("then", ["claim_or_idle", "stopping", "reclaim"])
def test_a_route_that_makes_an_executor_working_leaves_the_record_to_its_next_step(table, r, then):
    """Without a batch window the route makes the executor WORKING, but the change and
    its route:L2 count are recorded by the executor's next script (off the task's path):
    at the route's time, before that script's own change, and once."""
    register(table, "a", max_wait_ms=0)
    idle(table, "a")
    before = changes_of(r, "a")
    assert route(table, 0)[1] == "a"
    assert changes_of(r, "a") == before and routed_to_l2(r) == 0
    routed_ms = int(r.hget(keys.executor("a"), "routed_ms"))
    if then == "claim_or_idle":
        assert table.claim_or_idle("a", MODEL, 4) is None  # its task is still in L2
        last = "IDLE"
    elif then == "stopping":
        table.set_state("a", MODEL, State.STOPPING)
        last = "STOPPING"
    else:
        assert table.reclaim("a", MODEL, force=True) == 1
        last = "GONE"
    after = changes_of(r, "a")[len(before) :]
    assert [state for state, _ in after] == ["WORKING", last]
    assert after[0][1] == routed_ms <= after[1][1]
    assert routed_to_l2(r) == 1
    assert not r.hexists(keys.executor("a"), "routed_ms")
    if then == "claim_or_idle":
        idle(table, "a")
    elif then == "stopping":
        table.set_state("a", MODEL, State.STOPPING)
    if then != "reclaim":
        assert [state for state, _ in changes_of(r, "a")[len(before) :]][:2] == ["WORKING", last]
        assert routed_to_l2(r) == 1  # recorded once


def test_a_route_with_a_batch_window_records_and_counts_at_once(table, r):
    register(table, "a", max_wait_ms=5)
    idle(table, "a")
    assert route(table, 0)[1] == "a"
    assert routed_to_l2(r) == 1
    assert not r.hexists(keys.executor("a"), "routed_ms")


def test_a_working_executor_gets_nothing(table, r):
    register(table, "a")  # registers WORKING
    assert route(table, 0)[1] is None
    assert r.llen(keys.l2("a")) == 0


def test_a_waiting_executor_is_preferred_over_an_idle_one(table):
    for executor_id in ("a", "b"):
        register(table, executor_id)
        idle(table, executor_id)
    first = route(table, 0)[1]
    table.set_state(first, MODEL, State.WAITING)
    assert [route(table, n)[1] for n in range(3)] == [first] * 3


def test_a_dead_executor_gets_nothing(table, r):
    register(table, "a", ttl_ms=-1)
    idle(table, "a")
    assert route(table, 0)[1] is None


def test_the_longest_idle_executor_is_routed_to_first(table):
    for executor_id in ("c", "a", "b"):
        register(table, executor_id, max_wait_ms=0.0)
    for executor_id in ("c", "a", "b"):  # idle in this order
        idle(table, executor_id)
    assert [route(table, n)[1] for n in range(3)] == ["c", "a", "b"]
    idle(table, "a")
    assert [route(table, n)[1] for n in range(3, 5)] == ["a", None]


def test_the_ready_set_follows_every_state_change(table, r):
    ready = keys.ready(MODEL)
    register(table, "a")
    assert r.zscore(ready, "a") is None  # WORKING
    idle(table, "a")
    assert r.zscore(ready, "a") >= keys.READY_IDLE
    route(table, 0)
    table.set_state("a", MODEL, State.WAITING)
    assert r.zscore(ready, "a") == 3  # its capacity: 4 less the one routed
    route(table, 1)
    assert r.zscore(ready, "a") == 2
    table.begin("a", MODEL, room=2, taken=0)
    assert r.zscore(ready, "a") is None  # WORKING
    idle(table, "a")
    table.set_state("a", MODEL, State.STOPPING)
    assert r.zscore(ready, "a") is None
    register(table, "b")
    idle(table, "b")
    table.reclaim("b", MODEL, force=True)
    assert r.zcard(ready) == 0


def test_a_lapsed_executor_is_dropped_and_its_heartbeat_puts_it_back(table, r):
    register(table, "a", ttl_ms=-1)
    idle(table, "a")
    assert route(table, 0)[1] is None
    assert r.zscore(keys.ready(MODEL), "a") is None
    assert table.claim("a", MODEL, 1)  # its executor takes that task, and goes idle
    assert table.claim_or_idle("a", MODEL, 4) is None
    r.zrem(keys.ready(MODEL), "a")  # dropped again while lapsed
    table.heartbeat(["a"], 60_000)
    assert route(table, 1)[1] == "a"


def test_claim_or_idle_claims_while_work_waits_and_else_goes_idle(table, r):
    register(table, "a")  # WORKING, as after a compute
    ids = [route(table, n)[0] for n in range(3)]
    batch = table.claim_or_idle("a", MODEL, 2)
    assert [json.loads(m)["headers"]["id"] for m in batch] == ids[:2]
    assert not batch.redelivered and r.hget(keys.executor("a"), "state") == b"WORKING"
    assert len(table.claim_or_idle("a", MODEL, 2)) == 1
    assert table.claim_or_idle("a", MODEL, 2) is None  # nothing left: IDLE, in one step
    assert r.hmget(keys.executor("a"), "state", "cap") == [b"IDLE", b"2"]
    assert r.zscore(keys.ready(MODEL), "a") >= keys.READY_IDLE
    table.set_state("a", MODEL, State.STOPPING)
    route(table, 9)  # to L1: a STOPPING executor takes nothing more
    assert table.claim_or_idle("a", MODEL, 2) is None
    assert r.hget(keys.executor("a"), "state") == b"STOPPING" and table.l1_depth(MODEL) == 1


def test_claim_takes_oldest_first_and_higher_priority_first(table, r):
    register(table, "a")
    low = [route(table, n, priority=9)[0] for n in range(2)]
    normal = [route(table, n)[0] for n in range(3)]
    claimed = table.claim("a", MODEL, 4)
    assert [json.loads(m)["headers"]["id"] for m in claimed] == normal + low[:1]
    assert ids_in(r, keys.inflight("a")) == normal + low[:1]


#: Past this length, Redis 6 pops L1 one message at a time (_lib.lua's pop_tail).
LONG_LIST = int(re.findall(r"^local LONG_LIST = (\d+)", scripts.source("claim"), flags=re.M)[0])


def fill_l1(r, count: int, priority: int = 0) -> list[str]:
    """count messages pushed into L1 as a producer's route would (LPUSH), their ids
    oldest first."""
    ids, raws = [], []
    for n in range(count):
        task_id, envelope = message.encode(MODEL, [n], queue=keys.l1(MODEL), priority=priority)
        ids.append(task_id)
        raws.append(envelope)
    key = keys.l1_for_priority(MODEL, priority)
    for start in range(0, count, 500):
        r.lpush(key, *raws[start : start + 500])
    return ids


@hsettings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    normal=st.sampled_from([0, 5, LONG_LIST - 1, LONG_LIST, LONG_LIST + 1, LONG_LIST + 40]),
    low=st.sampled_from([0, 3, LONG_LIST + 2]),
    n=st.integers(1, 64),
)
def test_claims_take_l1_oldest_first_whatever_its_length(table, r, normal, low, n):
    """A long L1 (a backlog) is claimed as a short one is: oldest first, higher priority
    first, each message once, in-flight in claim order; past LONG_LIST, Redis 6 pops one
    at a time, and a claim across that length loses nothing."""
    r.flushdb()
    register(table, "a", max_batch=n)
    expected = fill_l1(r, normal) + fill_l1(r, low, priority=9)
    claimed: list[str] = []
    while batch := table.claim("a", MODEL, n):
        assert len(batch) == min(n, len(expected) - len(claimed))
        claimed += [json.loads(m)["headers"]["id"] for m in batch]
    assert claimed == expected
    assert ids_in(r, keys.inflight("a")) == expected
    assert table.l1_depth(MODEL) == 0


def test_a_claim_from_a_long_l1_pops_from_its_tail(table, r):
    """Redis 6 finds where `RPOP key n` starts by walking the list from its head, so a
    claim from a long L1 pops one message at a time (Redis 7 seeks from the nearer end)."""
    if int(r.info("server")["redis_version"].split(".")[0]) >= 7:
        pytest.skip("Redis 7 pops a count from the tail without walking the list")
    register(table, "a", max_batch=8)
    fill_l1(r, LONG_LIST + 8)
    r.config_set("slowlog-log-slower-than", 0)
    try:
        r.slowlog_reset()
        assert len(table.claim("a", MODEL, 8)) == 8  # from the long list
        assert len(table.claim("a", MODEL, 8)) == 8  # now LONG_LIST long: one RPOP of 8
        pops = [
            e["command"].split()[1:3]
            for e in reversed(r.slowlog_get(1000))
            if e["command"].split()[0].upper() == b"RPOP"
        ]
    finally:
        r.config_set("slowlog-log-slower-than", 10_000)
    key = keys.l1(MODEL).encode()
    assert pops == [[key]] * 8 + [[key, b"8"]]


def test_begin_takes_l2_and_tops_up_from_l1(table, r):
    register(table, "a")
    idle(table, "a")
    in_l2 = [route(table, n)[0] for n in range(2)]
    table.set_state("a", MODEL, State.WAITING)
    # A plain Celery client publishes straight to L1.
    r.lpush(keys.l1(MODEL), message.encode(MODEL, [9], queue=keys.l1(MODEL))[1])
    held = table.begin("a", MODEL, room=4, taken=0)
    assert [json.loads(m)["headers"]["id"] for m in held][:2] == in_l2
    assert len(held) == 3
    assert r.hget(keys.executor("a"), "state") == b"WORKING"
    assert r.hget(keys.executor("a"), "cap") == b"0"


def test_begin_with_nothing_held_or_queued_changes_nothing(table, r):
    register(table, "a")
    idle(table, "a")
    assert table.begin("a", MODEL, room=4, taken=0) == []
    assert r.hget(keys.executor("a"), "state") == b"IDLE"


def test_queue_bound_raises_queue_full(table, r):
    table.register(
        "a", MODEL, worker="w", max_batch=4, ttl_ms=60_000, max_wait_ms=0, pid=1, max_queue=2
    )
    route(table, 0)
    route(table, 1)
    with pytest.raises(QueueFull, match="2 tasks waiting"):
        route(table, 2)
    assert table.l1_depth(MODEL) == 2
    register(table, "b")  # a worker without a bound lifts it
    route(table, 3)


def test_a_burst_is_routed_as_the_same_tasks_one_by_one_would_be(table, r):
    """route_many, in script calls of 3: capacity first (WAITING, then the longest IDLE),
    then L1 up to its bound, then QueueFull for each task over it; none lost."""
    for executor_id in ("a", "b"):
        table.register(
            executor_id,
            MODEL,
            worker="w",
            max_batch=2,
            ttl_ms=60_000,
            max_wait_ms=5,
            pid=1,
            max_queue=3,
        )
    idle(table, "a", max_batch=2)
    idle(table, "b", max_batch=2)
    table.set_state("b", MODEL, State.WAITING)
    sent = [message.encode(MODEL, [n], queue=keys.l1(MODEL)) for n in range(9)]
    replies = table.route_many(MODEL, [m for _, m in sent], chunk=3)
    assert replies[:7] == ["b", "b", "a", "a", None, None, None]
    assert all(isinstance(e, QueueFull) and "3 tasks waiting" in str(e) for e in replies[7:])
    assert ids_in(r, keys.l2("b")) == [sent[0][0], sent[1][0]]
    assert ids_in(r, keys.l1(MODEL)) == [task_id for task_id, _ in sent[4:7]]
    assert r.zcard(keys.ready(MODEL)) == 0
    assert r.hgetall(keys.metrics(MODEL)) == {
        b"route:L2": b"4",
        b"route:L1": b"3",
        b"refused:full": b"2",  # offered too: the fleet's size counts them (scaling.py)
    }


def test_a_burst_for_an_unknown_model_enqueues_nothing(table, r):
    with pytest.raises(UnknownModel):
        table.route_many(MODEL, ["x", "y"])
    assert r.dbsize() == 0


def test_filling_a_waiting_executor_says_so_on_its_full_channel(table, r):
    register(table, "a", max_batch=2)
    idle(table, "a", max_batch=2)
    table.set_state("a", MODEL, State.WAITING)
    with r.pubsub() as signals:
        signals.subscribe(keys.full("a"))
        assert signals.get_message(timeout=5)["type"] == "subscribe"
        route(table, 0)
        assert signals.get_message(timeout=0.1) is None
        route(table, 1)
        assert signals.get_message(timeout=5)["data"] == b"full"


def test_complete_drops_its_tasks_from_in_flight_in_any_order(table, r):
    """In claim order the tail is trimmed at once; any other order, each task is searched
    for; either way only this batch's tasks leave in-flight."""
    register(table, "a", max_batch=8)
    for n in range(6):
        route(table, n)
    batch = table.claim("a", MODEL, 3)
    later = table.claim("a", MODEL, 3)
    for order in (list(batch), [later[2], later[0], later[1]]):
        entries = [(raw, keys.result(json.loads(raw)["headers"]["id"]), "{}") for raw in order]
        assert table.complete("a", entries, model=MODEL) == 3
        left = r.lrange(keys.inflight("a"), 0, -1)
        assert not set(order) & set(left)
    assert r.llen(keys.inflight("a")) == 0
    assert r.hget(keys.metrics(MODEL), "stored") == b"6"


def test_reclaim_spares_a_live_executor(table, r):
    register(table, "a")
    assert table.reclaim("a", MODEL) == -1
    assert r.exists(keys.executor("a"))


def test_reclaim_moves_inflight_and_l2_to_the_head_of_l1_in_order(table, r):
    register(table, "a")
    backlog = [route(table, n)[0] for n in range(2)]
    table.claim("a", MODEL, 2)  # in-flight now
    idle(table, "a")
    in_l2 = [route(table, n)[0] for n in range(2)]
    table.set_state("a", MODEL, State.STOPPING)  # routes nothing more here
    later = route(table, 9)[0]
    assert ids_in(r, keys.l1(MODEL)) == [later]
    r.hset(keys.executor("a"), "expires_ms", 0)
    assert table.reclaim("a", MODEL) == 4
    assert ids_in(r, keys.l1(MODEL)) == backlog + in_l2 + [later]
    assert not r.exists(keys.executor("a"), keys.l2("a"), keys.inflight("a"))
    assert table.executor_ids(MODEL) == []
    with pytest.raises(ExecutorGone):
        table.claim("a", MODEL, 1)


def test_reclaim_keeps_each_task_at_its_priority(table, r):
    register(table, "a")
    urgent, _ = route(table, 0, priority=0)
    low, _ = route(table, 1, priority=7)
    table.claim("a", MODEL, 2)
    assert table.reclaim("a", MODEL, force=True) == 2
    assert ids_in(r, keys.l1(MODEL)) == [urgent]
    assert ids_in(r, keys.l1_for_priority(MODEL, 7)) == [low]


def test_complete_stores_celery_results_and_never_overwrites_success(table, r):
    register(table, "a")
    task_id, _ = route(table, 0)
    raw = table.claim("a", MODEL, 1)[0]
    key = keys.result(task_id)
    assert table.complete("a", [(raw, key, json.dumps({"status": "SUCCESS", "result": 1}))]) == 1
    # Again, as from a second compute: nothing stored anew, so nothing to count.
    assert table.complete("a", [(raw, key, json.dumps({"status": "FAILURE", "result": 2}))]) == -1
    assert json.loads(r.get(key)) == {"status": "SUCCESS", "result": 1}
    assert 0 < r.ttl(key) <= 60
    assert r.llen(keys.inflight("a")) == 0
    assert r.hget(keys.STATS, "duplicates") == b"1"  # the second compute, kept out


def test_results_go_alone_and_count_lua_adds_their_bookkeeping_after(table, r):
    """complete.lua stores and publishes the results and adds only `stored`; count.lua
    adds the batches' metrics, the executor's counts and its latency model after."""
    speed = Speed(1.0, 0.5, 0.2, rate=100.0, lag_ms=12.0, max_batch=4, extra_ms=3.0)
    counts = {"outcome:SUCCESS": 2, "compute_ms:sum": 5.0}
    register(table, "a")
    with r.pubsub() as published:
        published.psubscribe(f"{keys.RESULT_PREFIX}*")
        assert published.get_message(timeout=5)["type"] == "psubscribe"
        for n in range(2):
            task_id, _ = route(table, n)
            raw = table.claim("a", MODEL, 1)[0]
            entry = (raw, keys.result(task_id), results.success(task_id, [n]))
            assert table.complete("a", [entry], model=MODEL) == 1
            assert published.get_message(timeout=5)["data"] == entry[2].encode()
            assert r.get(keys.result(task_id)) == entry[2].encode()
    assert r.llen(keys.inflight("a")) == 0
    assert r.hgetall(keys.metrics(MODEL)) == {b"route:L1": b"2", b"stored": b"2"}
    assert r.hget(keys.executor("a"), "batches") in (None, b"0")
    assert not r.exists(keys.speed(MODEL))
    table.count_batch("a", MODEL, 2, batches=2, counters=counts, speed=speed)
    assert r.hgetall(keys.metrics(MODEL)) == {
        b"route:L1": b"2",
        b"stored": b"2",
        b"outcome:SUCCESS": b"2",
        b"compute_ms:sum": b"5",
    }
    executor = r.hgetall(keys.executor("a"))
    assert (executor[b"tasks"], executor[b"batches"], executor[b"rate"]) == (b"2", b"2", b"100")
    assert table.speed(MODEL).rate == 100


def test_a_count_for_a_gone_executor_adds_its_metrics_alone(table, r):
    table.count_batch("gone", MODEL, 3, counters={"outcome:SUCCESS": 3})
    assert r.hget(keys.metrics(MODEL), "outcome:SUCCESS") == b"3"
    assert not r.exists(keys.executor("gone"))


def test_complete_run_again_changes_nothing(table, r):
    """A retry of the same store (its reply lost, or a failover that may or may not
    have kept the first run) stores nothing twice, counts nothing twice and publishes
    nothing again."""
    register(table, "a")
    ids = [route(table, n)[0] for n in range(2)]
    raws = table.claim("a", MODEL, 3)
    junk = b'{"headers": {}}'  # no usable id: a dead letter
    r.lpush(keys.inflight("a"), junk)
    entries = [
        (raw, keys.result(i), results.success(i, [n]))
        for n, (raw, i) in enumerate(zip(raws, ids, strict=True))
    ]
    entries.append((junk, "", '{"reason": "BadInput: no id"}'))
    assert table.complete("a", entries, model=MODEL) == 3
    before = {k: r.dump(k) for k in r.keys("*")}
    with r.pubsub() as published:
        published.psubscribe(f"{keys.RESULT_PREFIX}*")
        assert published.get_message(timeout=5)["type"] == "psubscribe"
        # Negated: the second run found nothing to store or drop, so nothing to count.
        assert table.complete("a", entries, model=MODEL) == -3
        assert published.get_message(timeout=0.2) is None
    assert {k: r.dump(k) for k in r.keys("*")} == before
    assert r.llen(keys.DEAD) == 1 and r.hget(keys.STATS, "duplicates") is None
    assert r.hget(keys.metrics(MODEL), "stored") == b"3"


def test_complete_after_a_lost_store_stores_and_counts_it(table, r):
    """A retry whose first run never landed (a failover lost it): in-flight still holds
    the batch, so it is stored, dropped and counted as the first run would have."""
    register(table, "a")
    task_id, _ = route(table, 0)
    raw = table.claim("a", MODEL, 1)[0]
    entry = (raw, keys.result(task_id), results.success(task_id, [0]))
    assert table.complete("a", [entry], model=MODEL) == 1
    r.delete(keys.result(task_id), keys.metrics(MODEL))  # the first run, lost
    r.lpush(keys.inflight("a"), raw)
    assert table.complete("a", [entry], model=MODEL) == 1  # to be counted
    assert r.get(keys.result(task_id)) == entry[2].encode()
    assert r.llen(keys.inflight("a")) == 0
    assert r.hget(keys.metrics(MODEL), "stored") == b"1"


def test_complete_never_overwrites_a_revoked_result(table, r):
    register(table, "a")
    task_id, _ = route(table, 0)
    raw = table.claim("a", MODEL, 1)[0]
    key = keys.result(task_id)
    r.set(key, results.revoked(task_id))  # revoked while it computed
    table.complete("a", [(raw, key, results.success(task_id, [1]))])
    assert json.loads(r.get(key))["status"] == "REVOKED"
    assert r.hget(keys.STATS, "duplicates") is None  # a kept REVOKED is no duplicate
    assert r.llen(keys.inflight("a")) == 0


def test_revocation_records_expire(table, r):
    table.revoke(["gone", "kept"], ttl_s=60)
    assert table.revoked(["gone", "kept", "other"]) == {"gone", "kept"}
    r.zadd(keys.REVOKED, {"gone": table.now_ms() - 1})  # its record has expired
    assert table.revoked(["gone", "kept"]) == {"kept"}
    table.revoke(["new"], ttl_s=60)  # pruned on the way
    assert r.zscore(keys.REVOKED, "gone") is None and table.revocations() == 2


def test_heartbeat_reports_reclaimed_executors(table, r):
    register(table, "a")
    register(table, "b")
    r.delete(keys.executor("b"))
    assert table.heartbeat(["a", "b"], 1000) == ["b"]


def test_stopping_is_final_until_the_executor_registers_again(table, r):
    register(table, "a")
    idle(table, "a")
    table.set_state("a", MODEL, State.STOPPING)
    for step in (
        lambda: table.claim_or_idle("a", MODEL, 4),
        lambda: table.set_state("a", MODEL, State.WAITING),
        lambda: table.begin("a", MODEL, room=4, taken=1),
    ):
        step()
        assert r.hget(keys.executor("a"), "state") == b"STOPPING"
        assert r.hget(keys.executor("a"), "cap") == b"0"
    assert route(table, 1)[1] is None  # to L1, never to a stopping executor's L2
    register(table, "a")
    assert r.hget(keys.executor("a"), "state") == b"WORKING"


def died_holding(table: Table, r, executor_id: str, n: int) -> list[str]:
    """Register, claim n tasks from L1, die (heartbeat lapsed) and get reclaimed."""
    register(table, executor_id)
    claimed = table.claim(executor_id, MODEL, n)
    r.hset(keys.executor(executor_id), "expires_ms", 0)
    assert table.reclaim(executor_id, MODEL, count=True) == len(claimed)
    return [json.loads(m)["headers"]["id"] for m in claimed]


def test_a_death_counts_a_delivery_and_sends_in_flight_to_the_retry_list(table, r):
    register(table, "a")
    held = [route(table, n)[0] for n in range(2)]
    untouched = route(table, 2)[0]
    assert sorted(died_holding(table, r, "b", 2)) == sorted(held)
    assert sorted(ids_in(r, keys.retry(MODEL))) == sorted(held)
    assert ids_in(r, keys.l1(MODEL)) == [untouched]
    assert r.hget(keys.STATS, "redelivered") == b"2"
    # A forced reclaim without a death (a resync) counts nothing more, but keeps them apart.
    raw = table.claim("a", MODEL, 1, alone=True)
    table.reclaim("a", MODEL, force=True)
    assert r.lrange(keys.deliveries(raw[0]), 0, -1) == [b"b"]
    assert r.llen(keys.retry(MODEL)) == 2


def test_a_redelivered_task_is_claimed_alone_and_before_l1(table, r):
    register(table, "busy")
    route(table, 0)
    died_holding(table, r, "dead", 1)
    fresh = [route(table, n)[0] for n in range(1, 4)]
    register(table, "a")
    assert r.llen(keys.retry(MODEL)) == 1  # work that claim_or_idle would take
    # A batch with room but tasks already in it never takes a retry task.
    assert ids_in_batch(table.claim("a", MODEL, 1)) == fresh[:1]
    redelivered = table.claim("a", MODEL, 4, alone=True)
    assert len(redelivered) == 1 and redelivered.redelivered
    assert r.llen(keys.retry(MODEL)) == 0
    rest = table.claim("a", MODEL, 4, alone=True)
    assert ids_in_batch(rest) == fresh[1:] and not rest.redelivered


def test_begin_takes_a_retry_task_alone_only_into_an_empty_batch(table, r):
    register(table, "busy")
    route(table, 0)
    died_holding(table, r, "dead", 1)
    register(table, "a")
    retry = r.lrange(keys.retry(MODEL), 0, -1)
    in_l1 = route(table, 1)[0]
    assert ids_in_batch(table.begin("a", MODEL, room=3, taken=1)) == [in_l1]
    assert r.lrange(keys.retry(MODEL), 0, -1) == retry
    alone = table.begin("a", MODEL, room=4, taken=0)
    assert alone == retry and alone.redelivered


def ids_in_batch(batch: list[bytes]) -> list[str]:
    return [json.loads(m)["headers"]["id"] for m in batch]


def test_max_deliveries_sends_a_task_to_the_poison_list(r):
    table = Table(r, Settings(max_deliveries=2))
    register(table, "busy")
    route(table, 0)
    died_holding(table, r, "d1", 1)
    assert r.llen(keys.retry(MODEL)) == 1
    register(table, "d2")
    raw = table.claim("d2", MODEL, 4, alone=True)
    r.hset(keys.executor("d2"), "expires_ms", 0)
    table.reclaim("d2", MODEL, count=True)
    assert r.lrange(keys.POISON, 0, -1) == raw
    assert r.lrange(keys.deliveries(raw[0]), 0, -1) == [b"d1", b"d2"]
    assert r.hget(keys.STATS, "poisoned") == b"1"


def test_dead_letters_are_capped_and_expire(r):
    table = Table(r, Settings(dead_letter_max=2, dead_letter_ttl_s=30))
    register(table, "a")
    for n in range(3):
        raw = f"junk {n}".encode()
        r.lpush(keys.inflight("a"), raw)
        table.complete("a", [(raw, "", deadletter.record(raw, f"BadInput: junk {n}", model=MODEL))])
    letters = deadletter.read(r)
    assert [letter.reason for letter in letters] == ["BadInput: junk 2", "BadInput: junk 1"]
    assert letters[0].raw == b"junk 2" and letters[0].model == MODEL and letters[0].id is None
    assert 0 < r.ttl(keys.DEAD) <= 30
    assert r.llen(keys.inflight("a")) == 0
    assert r.hget(keys.STATS, "dead_lettered") == b"3"


def test_bury_keeps_a_success_and_buries_once(table, r):
    task_id, envelope = message.encode(MODEL, [1], queue=keys.l1(MODEL))
    raw = envelope.encode()
    r.rpush(keys.POISON, raw)
    r.set(keys.result(task_id), '{"status": "SUCCESS", "result": 1}')
    record = deadletter.record(raw, "PoisonMessage: x", task_id=task_id, model=MODEL)
    assert table.bury(raw, record, task_id, '{"status": "FAILURE"}')
    assert not table.bury(raw, record, task_id, '{"status": "FAILURE"}')
    assert json.loads(r.get(keys.result(task_id)))["status"] == "SUCCESS"
    assert deadletter.count(r) == 1


def test_the_lua_and_python_ready_idle_agree():
    """READY_IDLE is written in _lib.lua and in broker/keys.py: one value."""
    lua = scripts.source("route")
    (value,) = re.findall(r"^local READY_IDLE = (\d+)", lua, flags=re.M)
    assert int(value) == keys.READY_IDLE


def dead_letter(r, n: int) -> deadletter.DeadLetter:
    """A requeueable dead letter of MODEL at the head of the list, with a delivery count."""
    task_id, envelope = message.encode(MODEL, [n], queue=keys.l1(MODEL))
    record = deadletter.record(envelope.encode(), "PoisonMessage: test", task_id=task_id)
    r.lpush(keys.DEAD, record.replace('"model": null', f'"model": "{MODEL}"'))
    r.set(keys.deliveries(envelope.encode()), 3)
    (letter,) = deadletter.read(r, 1)
    return letter


def test_a_requeue_routes_drops_the_letter_and_its_count_in_one_step(table, r):
    table.register("a", MODEL, worker="w", max_batch=4, ttl_ms=60_000, max_wait_ms=0, pid=1)
    letter = dead_letter(r, 1)
    assert deadletter.requeue(table, letter) == f"L1 of {MODEL}"  # "a" is WORKING
    assert deadletter.count(r) == 0 and not r.exists(keys.deliveries(letter.raw))
    assert table.l1_depth(MODEL) == 1
    with pytest.raises(TandemError, match="gone"):  # a second requeue finds no letter
        deadletter.requeue(table, letter)
    assert table.l1_depth(MODEL) == 1


def test_a_refused_requeue_keeps_the_letter(table, r):
    table.register(
        "a", MODEL, worker="w", max_batch=4, ttl_ms=60_000, max_wait_ms=0, pid=1, max_queue=1
    )
    table.route(MODEL, "ahead")  # L1 holds its bound now
    letter = dead_letter(r, 2)
    with pytest.raises(QueueFull):
        deadletter.requeue(table, letter)
    assert deadletter.count(r) == 1 and r.exists(keys.deliveries(letter.raw))
    assert table.l1_depth(MODEL) == 1
    r.srem(keys.MODELS, MODEL)
    r.delete(keys.executor("a"), keys.ready(MODEL))
    with pytest.raises(UnknownModel):
        deadletter.requeue(table, letter)
    assert deadletter.count(r) == 1


def test_a_queue_of_another_type_is_set_aside_and_the_task_enqueued(table, r):
    """Anyone with Redis can write at tandem's keys: a string at L1 is moved to
    L1:wrongtype (kept, read by nobody) and the task goes into a fresh L1."""
    r.set(keys.l1(MODEL), b"not a queue")
    r.set(keys.retry(MODEL), b"nor this")
    register(table, "a")  # WORKING: a task goes to L1
    task_id, _ = route(table, 0)
    assert ids_in(r, keys.l1(MODEL)) == [task_id]
    assert r.get(keys.l1(MODEL) + ":wrongtype") == b"not a queue"
    assert [json.loads(m)["headers"]["id"] for m in table.claim("a", MODEL, 1)] == [task_id]
    assert r.get(keys.retry(MODEL) + ":wrongtype") is None  # not read by a plain claim
    idle(table, "a")  # claim_or_idle reads the retry list: set aside there too
    assert r.get(keys.retry(MODEL) + ":wrongtype") == b"nor this"


def test_a_counter_that_is_not_a_number_starts_again(table, r):
    r.hset(keys.metrics(MODEL), "route:L1", b"junk")
    r.hset(keys.STATS, "registrations", b"1.5e")
    register(table, "a")
    route(table, 0)
    assert r.hget(keys.metrics(MODEL), "route:L1") == b"1"
    assert r.hget(keys.STATS, "registrations") == b"1"
    r.delete(keys.metrics(MODEL))
    r.rpush(keys.metrics(MODEL), b"a list")
    route(table, 1)
    assert r.hget(keys.metrics(MODEL), "route:L1") == b"1"
    assert r.lrange(keys.metrics(MODEL) + ":wrongtype", 0, -1) == [b"a list"]


def test_dead_letters_older_than_their_ttl_leave_the_list(r):
    """A steady trickle of dead letters keeps about one TTL of them, not the cap."""
    table = Table(r, Settings(dead_letter_ttl_s=60, dead_letter_max=1000))
    register(table, "a")
    now = table.now_ms() / 1000
    old = [json.dumps({"reason": "old", "at_s": now - 120 - n}) for n in range(3)]
    kept = json.dumps({"reason": "recent", "at_s": now - 30})
    r.rpush(keys.DEAD, kept, *old)  # newest first: the old ones at the tail
    junk = b'{"headers": {}}'
    r.lpush(keys.inflight("a"), junk)
    table.complete("a", [(junk, "", deadletter.record(junk, "BadInput: no id"))])
    reasons = [json.loads(x)["reason"] for x in r.lrange(keys.DEAD, 0, -1)]
    assert reasons == ["BadInput: no id", "recent"]


def test_tally_adds_whole_numbers_exactly_and_fractions_as_floats(r):
    """_lib.lua's tally: a whole Lua number or string of digits takes HINCRBY, anything
    else HINCRBYFLOAT, and a field that is not a number starts again."""
    lua = (resources.files(scripts) / "_lib.lua").read_text()
    run = r.register_script(
        lua
        + """
for i = 1, #ARGV, 2 do
  local by = ARGV[i + 1]
  if string.sub(by, 1, 1) == 'n' then by = tonumber(string.sub(by, 2)) end
  tally(KEYS[1], ARGV[i], by)
end
return 1
"""
    )
    r.hset("counts", "text", "not a number")
    pairs = {"a": "n3", "b": "n3", "c": "n0.5", "d": "7", "e": "1.5", "big": "n1e15"}
    pairs |= {"neg": "n-2", "text": "n4"}
    run(keys=["counts"], args=[x for kv in pairs.items() for x in kv])
    run(keys=["counts"], args=["a", "n3", "d", "-7"])
    assert r.hgetall("counts") == {
        b"a": b"6", b"b": b"3", b"c": b"0.5", b"d": b"0", b"e": b"1.5",
        b"big": b"1000000000000000", b"neg": b"-2", b"text": b"4",
    }  # fmt: skip


def test_a_single_route_replies_as_a_list_of_one_would(table, r):
    """route_one.lua, a submit's route, replies with what route.lua replies for its one
    message, alone: for an executor, L1, QueueFull, Overloaded, and an unknown model."""

    def with_executor():
        register(table, "a")
        idle(table, "a")

    def full():
        register(table, "a")
        r.hset(keys.MAX_QUEUE, MODEL, 1)
        r.lpush(keys.l1(MODEL), "waiting")

    def slow():
        register(table, "a")
        r.lpush(keys.l1(MODEL), "waiting")
        r.hset(keys.speed(MODEL), mapping={"rate": 0.001, "batches": 1})

    cases = [(with_executor, None), (lambda: register(table, "a"), None), (full, None)]
    cases += [(slow, 10.0), (lambda: None, None)]
    for setup, deadline_s in cases:
        replies = []
        for script in (table.scripts.route_one, table.scripts.route):
            r.flushdb()
            setup()
            deadline = None if deadline_s is None else time.time() + deadline_s
            try:
                replies.append(script(**table.route_call(MODEL, ["x"], 0, deadline)))
            except redis.ResponseError as e:
                replies.append(str(e))
        one, listed = replies
        assert [one] == listed if isinstance(listed, list) else one == listed
