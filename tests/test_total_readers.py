"""Every reader of tandem's keys is total: values and types written into them by hand end
no process, `tandem status` and /metrics still answer, and good tasks are still served.

The corruption reaches what the readers read: the executor table (models, an executor's
hash, the deadlines, the state stream and its relay mark), the counters and the lists the
coordinator drains, with junk members, junk fields and junk values, and wrong types. The
queues and counters a script writes for every task (a served model's L1 at each priority
and its retry list, the stats and its metrics hash) get wrong types and junk counter
values too: the scripts set a wrong-typed key aside (KEY:wrongtype) and start a counter
that is not a number again, so the model goes on.
"""

from __future__ import annotations

import urllib.request

import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from helpers import tandem, wait_until
from tandem.broker import keys
from tandem.broker.table import Table
from tandem.producers.client import Client
from tandem.server import free_port
from tandem.status import snapshot

junk = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([b"soon", b"nan", b"inf", b"-1", b"1e400", b"\xff\xfe", b"", b"a:b:c"]),
)


def corruptions(executor_id: str):
    """One hand-written change to a key that tandem's readers read."""
    value = st.tuples(junk, junk)
    return st.one_of(
        st.builds(lambda m: ("sadd", keys.MODELS, m), junk),
        st.builds(
            lambda f: ("hset", keys.executor(executor_id), f),
            st.sampled_from([b"expires_ms", b"batches", b"tasks", b"model", b"worker"]).flatmap(
                lambda f: junk.map(lambda v: (f, v))
            ),
        ),
        st.builds(lambda fv: ("hset", keys.STATS, fv), value),
        st.builds(lambda fv: ("hset", keys.metrics("sim:1"), fv), value),
        st.builds(lambda m: ("zadd", keys.DEADLINES, m), junk),
        st.builds(lambda fv: ("xadd", keys.STATE_STREAM, fv), value),
        st.builds(lambda v: ("set", keys.RELAYED, v), junk),
        st.builds(lambda v: ("retype", keys.DEAD, v), junk),
        st.builds(lambda v: ("retype", keys.POISON, v), junk),
        st.builds(lambda v: ("retype", keys.RELAYED, v), junk),
        st.builds(lambda v: ("retype", keys.STATE_STREAM, v), junk),
        st.builds(lambda v: ("retype", keys.metrics("ghost:1"), v), junk),
        st.builds(lambda v: ("retype", keys.metrics("sim:1"), v), junk),
        st.builds(lambda v: ("retype", keys.STATS, v), junk),
        st.builds(
            lambda kv: ("retype", *kv),
            st.tuples(st.sampled_from(sorted(every_key(executor_id))), junk),
        ),
        st.builds(
            lambda fv: ("hset", keys.metrics("sim:1"), fv),
            st.tuples(st.sampled_from(COUNTED), junk),
        ),
        st.builds(
            lambda fv: ("hset", keys.STATS, fv),
            st.tuples(st.sampled_from([b"duplicates", b"registrations", b"redelivered"]), junk),
        ),
    )


def every_key(executor_id: str) -> set[str]:
    """Every key broker/keys.py names, for sim:1, its executor and a message: a wrong
    type at any of them stops nothing for longer than a heartbeat or a retry."""
    model = "sim:1"
    return {
        keys.MODELS, keys.MAX_QUEUE, keys.SLO, keys.SPECS, keys.STATS, keys.STATE_STREAM,
        keys.DEAD, keys.REVOKED, keys.POISON, keys.DEADLINES, keys.RELAYED, keys.FENCE,
        keys.COORDINATOR,
        keys.deliveries(b"a message"), keys.result("some-task"),
        *keys.l1_keys(model), keys.retry(model), keys.executors(model), keys.ready(model),
        keys.speed(model), keys.metrics(model), keys.scale(model), keys.executor(executor_id),
        keys.l2(executor_id), keys.inflight(executor_id),
    }  # fmt: skip


#: Counters of a model's metrics hash that the scripts add to on every task's path.
COUNTED = [b"route:L2", b"route:L1", b"outcome:SUCCESS", b"deadline:met", b"compute_ms:sum"]
#: Keys that hold lists: a wrong type there is a string; anywhere else, a list.
LISTS = {keys.DEAD, keys.POISON, keys.retry("sim:1"), *keys.l1_keys("sim:1")}


def apply(r, change) -> None:
    """Make the change; a key an earlier example gave another type is replaced. Each step
    runs in one MULTI/EXEC, so a running worker's own write cannot land between the
    DEL and the write (it did once in CI: a heartbeat re-made the hash before the RPUSH)."""
    try:
        _apply(r, change)
    except redis.ResponseError as e:
        assert "WRONGTYPE" in str(e), e
        _apply(r, change, replace=True)


def _apply(r, change, replace: bool = False) -> None:
    op, key, arg = change
    with r.pipeline(transaction=True) as p:
        if replace or op == "retype":
            p.delete(key)
        if op == "sadd":
            p.sadd(key, arg)
            if arg == b"ghost:1" or not arg:
                p.sadd(key, b"ghost:1")  # a model with no executor and a wrong-typed metrics key
        elif op == "hset":
            p.hset(key, arg[0] or b"f", arg[1])
        elif op == "zadd":
            p.zadd(key, {arg or b"x": 0})
        elif op == "xadd":
            p.xadd(key, {arg[0] or b"f": arg[1]})
        elif op == "set":
            p.set(key, arg)
        else:  # retype: a key of the wrong type
            listed = key in LISTS or key.startswith((keys.L2_PREFIX, keys.INFLIGHT_PREFIX))
            listed = listed or key.startswith(keys.DELIVERIES_PREFIX)
            p.set(key, arg) if listed else p.rpush(key, arg or b"x")
        p.execute()


def test_hand_written_values_and_types_end_no_reader(processes, settings, r):
    port = free_port()
    worker = processes.worker("w1")
    coordinator = processes.coordinator(metrics_port=port)
    (executor,) = Table(r).executors()
    r.sadd(keys.MODELS, b"ghost:1")
    metrics = f"http://127.0.0.1:{port}/metrics"

    def answers() -> bool:
        try:
            with urllib.request.urlopen(metrics, timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    wait_until(answers, 30, "the coordinator's /metrics")

    with Client(settings=settings) as client:

        def served() -> bool:
            try:
                return client.submit("sim:1", [7]).get(timeout=5) == [7]
            except Exception:  # noqa: BLE001 - an executor reclaimed and registering again
                return False

        @hsettings(
            max_examples=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        )
        @given(st.lists(corruptions(executor.id), min_size=1, max_size=4))
        def corrupted(changes):
            for change in changes:
                apply(r, change)
            assert worker.poll() is None and coordinator.poll() is None
            snapshot(r)  # what `tandem status` reads and prints
            with urllib.request.urlopen(metrics, timeout=10) as response:
                assert response.status == 200
            wait_until(served, 20, "a good task to be served")

        corrupted()
    done = tandem("status", "--json", redis_url=settings.redis_url)
    assert done.returncode == 0, done.stderr
    assert worker.poll() is None and coordinator.poll() is None
    assert "Traceback" not in processes.log("coordinator")


def test_a_wrong_type_at_each_key_stops_nothing(processes, settings, r):
    """Every key in turn: a wrong type there, then a good task is still served, status
    and /metrics answer, and no process has exited."""
    port = free_port()
    worker = processes.worker("w1")
    coordinator = processes.coordinator(metrics_port=port)
    (executor,) = Table(r).executors()
    metrics = f"http://127.0.0.1:{port}/metrics"
    wait_until(lambda: _answers(metrics), 30, "the coordinator's /metrics")
    with Client(settings=settings) as client:

        def served() -> bool:
            try:
                return client.submit("sim:1", [7]).get(timeout=5) == [7]
            except Exception:  # noqa: BLE001 - an executor registering again
                return False

        for key in sorted(every_key(executor.id)):
            apply(r, ("retype", key, b"junk"))
            wait_until(served, 30, f"a good task served after a wrong type at {key}")
            snapshot(r)
            assert _answers(metrics), key
            assert worker.poll() is None and coordinator.poll() is None, key
    assert "Traceback" not in processes.log("coordinator")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status == 200
    except OSError:
        return False
