"""The scaling signal's reads (broker/demand.py) on a real Redis: every model's demand as
the per-model reads give it, in a number of round trips that does not grow with the
models (nor does the feed's), and a wrong-typed key moved aside when the signal is
published."""

from __future__ import annotations

import threading

import redis

from helpers import wait_until
from tandem.broker import keys, message
from tandem.broker.demand import FIELDS
from tandem.broker.table import Table
from tandem.coordinator.service import Coordinator

MODELS = [f"sim:{n}" for n in range(1, 9)]


class Counting(redis.Connection):
    """A connection that counts what it sends to Redis: one send a round trip."""

    sends = 0

    def send_packed_command(self, command, check_health=True):
        Counting.sends += 1
        return super().send_packed_command(command, check_health)


def read(executor) -> tuple:
    """What the signal reads of an executor (demand.FIELDS, and its two depths)."""
    fields = (getattr(executor, f) for f in FIELDS)
    return (executor.id, *fields, executor.l2_depth, executor.inflight_depth)


def fill(table: Table, models: list[str]) -> None:
    """Executors, queued tasks, counters, an SLO and a published signal for each model."""
    for n, model in enumerate(models):
        for e in range(n % 3 + 1):
            executor = f"{model}-e{e}"
            table.register(
                executor, model, worker="w", max_batch=4 + e, ttl_ms=60_000,
                max_wait_ms=0, pid=1, slo_ms=100.0 * (n + 1),
            )  # fmt: skip
            if e:
                table.redis.rpush(keys.l2(executor), *[b"task"] * e)
                speed = {"rate": 100.0 * e, "base_ms": 20, "per_item_ms": 0.5, "lag_ms": 30}
                table.redis.hset(keys.executor(executor), mapping=speed)
        table.redis.rpush(keys.l1_keys(model)[-1], *[b"task"] * (n + 1))
        table.redis.rpush(keys.l1(model), b"task")
        if n % 2:
            table.redis.rpush(keys.retry(model), b"task", b"task")
        table.redis.hset(keys.metrics(model), mapping={"stored": 10 * n, "shed:submit": n})
        table.redis.hset(keys.scale(model), mapping={"capacity_rps": 40.0 + n})


def test_every_models_demand_is_what_the_per_model_reads_give(r):
    table = Table(r)
    fill(table, MODELS[:5])
    r.sadd(keys.MODELS, "sim:9")  # a model no executor serves: all zero
    found = table.demands([*MODELS[:5], "sim:9"])
    for n, model in enumerate(MODELS[:5]):
        demand = found[model]
        assert [read(e) for e in demand.executors] == [read(e) for e in table.executors(model)]
        assert demand.counters == table.counters(model) == {"stored": 10 * n, "shed:submit": n}
        assert demand.l1_depth == table.l1_depth(model) == n + 2
        assert demand.retry_depth == table.retry_depth(model) == 2 * (n % 2)
        assert demand.published == table.scale(model) == {"capacity_rps": 40.0 + n}
        assert demand.slo_ms == 100.0 * (n + 1)
    empty = found["sim:9"]
    assert (empty.executors, empty.counters, empty.l1_depth, empty.slo_ms) == ([], {}, 0, None)


def test_the_round_trips_do_not_grow_with_the_models(redis_server, settings, r):
    client = redis.Redis(
        connection_pool=redis.ConnectionPool.from_url(redis_server.url, connection_class=Counting)
    )
    fill(Table(r), MODELS)
    sends = []
    for models in (MODELS[:1], MODELS):
        coordinator = Coordinator(settings, client)
        coordinator._models = models
        coordinator.scale()  # the connection's handshake, once
        Counting.sends = 0
        readings = coordinator.scale()
        sends.append(Counting.sends)
        assert sorted(readings) == models
    assert sends[0] == sends[1] <= 4  # Redis's clock, two reads, one write
    coordinator.feed()  # feed.lua loaded, once
    for models in (MODELS[:1], MODELS):
        coordinator._models = models
        Counting.sends = 0
        coordinator.feed()
        assert Counting.sends == 1
    table = Table(r)
    assert all(table.scale(m)["running"] == len(table.executors(m)) for m in MODELS)


def test_a_wrong_typed_signal_key_is_moved_aside_and_written(r):
    table = Table(r)
    r.rpush(keys.scale("sim:1"), b"not a hash")
    table.publish_scales({"sim:1": {"wanted": 2.0}, "sim:2": {"wanted": 1.0}})
    assert table.scale("sim:1") == {"wanted": 2.0} and table.scale("sim:2") == {"wanted": 1.0}
    assert r.lrange(keys.scale("sim:1") + ":wrongtype", 0, -1) == [b"not a hash"]


def test_the_signal_goes_on_beside_the_feed_and_after_its_connection_is_killed(settings, r):
    """A running coordinator publishes the signal on its own thread while its loop feeds
    L1 to a ready executor; killing its connections costs a round or two, not the signal."""
    table = Table(r)
    table.register("a", "sim:1", worker="w", max_batch=4, ttl_ms=60_000, max_wait_ms=5, pid=1)
    coordinator = Coordinator(settings)
    runner = threading.Thread(target=coordinator.run)
    runner.start()
    try:
        wait_until(lambda: table.scale("sim:1").get("at_ms"), 10, "a published signal")
        assert table.claim_or_idle("a", "sim:1", 4) is None  # IDLE: the feed's to fill
        r.lpush(keys.l1("sim:1"), message.encode("sim:1", [1], queue=keys.l1("sim:1"))[1])
        wait_until(lambda: r.llen(keys.l2("a")) == 1, 10, "the plain task fed to L2")
        r.client_kill_filter(_type="normal", skipme=True)
        killed_ms = table.now_ms()
        wait_until(lambda: table.scale("sim:1").get("at_ms", 0) > killed_ms, 10, "a signal after")
    finally:
        coordinator.stop()
        runner.join(30)
    assert not runner.is_alive()
