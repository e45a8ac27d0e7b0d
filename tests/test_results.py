"""The producer's result path: one pattern subscription per Client, read by the get() that
waits (producers/listener.py); and the executor's hand-offs at low load. A real Redis and
real executors throughout; no assertion on speed."""

from __future__ import annotations

import gc
import json
import threading
import time
import weakref

import pytest
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import AsyncResult
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from kombu.utils import json as kombu_json

from helpers import plain_celery, wait_until
from tandem.broker import keys, results
from tandem.broker.connect import connect, connect_async
from tandem.broker.errors import BadInput
from tandem.broker.table import Table
from tandem.producers.client import Client, TandemResult
from tandem.workers.executor import Executor
from tandem.workers.heartbeat import Heartbeat
from tandem.workers.models.sim import SimModel

MODEL = "sim:1"
#: Messages in Celery's result format whose state is not final.
NOT_FINAL = [b'{"status": "PENDING", "result": null}', b'{"status": "STARTED"}', b"[]", b"null"]
#: Each example makes a Client and a few round trips on the session's Redis.
settings_for_redis = hypothesis_settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


class Threads(SimModel):
    """sim that records the thread each forward pass ran on."""

    def __init__(self, base_ms: float = 0.0) -> None:
        super().__init__(base_ms=base_ms, per_item_ms=0.0)
        self.threads: list[str] = []

    def run(self, batch):
        self.threads.append(threading.current_thread().name)
        return super().run(batch)

    def validate(self, inputs):
        if inputs == "bad":
            raise BadInput("bad inputs")
        return inputs


@pytest.fixture
def executor(settings, r):
    """Start an in-process executor of a given model; stopped at teardown."""
    started = []

    def start(model, **overrides) -> Executor:
        mine = settings.replace(**overrides)
        ex = Executor(MODEL, model, table=Table(r), settings=mine, worker="t")
        ex.start()
        started.append((ex, Heartbeat(ex.table, [ex], interval_s=0.2, ttl_s=5).start()))
        return ex

    yield start
    for ex, beat in started:
        beat.stop()
        ex.stop()


def test_get_waits_on_the_subscription_and_never_sleeps(settings, executor, monkeypatch):
    executor(Threads())
    with Client(settings=settings) as client:
        client.submit(MODEL, 0).get(timeout=10)  # subscribed, scripts loaded

        def no_sleep(seconds):
            raise AssertionError(f"time.sleep({seconds}) on the result path")

        monkeypatch.setattr(time, "sleep", no_sleep)
        results = [client.submit(MODEL, [n]) for n in range(20)]
        assert [res.get(timeout=10) for res in results] == [[n] for n in range(20)]
        assert client.listener.delivered >= 21


def test_a_result_stored_before_get_is_found(settings, executor, r):
    executor(Threads())
    with Client(settings=settings) as client:
        res = client.submit(MODEL, "early")
        wait_until(lambda: r.exists(keys.result(res.id)), 10, "the result stored")
        assert res.get(timeout=10) == "early"
        assert res.state == "SUCCESS" and res.ready()


def test_task_ids_are_the_clients_and_uuid_shaped(settings, executor):
    executor(Threads())
    with Client(settings=settings) as one, Client(settings=settings) as other:
        a, b = one.submit(MODEL, 1), other.submit(MODEL, 2)
        assert a.id.startswith(one.listener.token + "-") and len(a.id) == 36
        assert b.id.split("-")[0] == other.listener.token != one.listener.token
        assert (a.get(timeout=10), b.get(timeout=10)) == (1, 2)


def test_a_result_nobody_holds_is_freed_at_once(settings, executor):
    """No reference cycle: a gotten result is freed when its last reference goes (the
    garbage collector off), and its Client stops keeping its task's place."""
    executor(Threads())
    with Client(settings=settings) as client:
        gc.disable()
        try:
            res = client.submit(MODEL, 1)
            assert res.get(timeout=10) == 1 and res.state == "SUCCESS"
            task_id, freed = res.id, weakref.ref(res)
            del res
            assert freed() is None
            assert not client.listener.expects(task_id)
        finally:
            gc.enable()


def test_a_result_is_made_as_celery_makes_one(settings):
    """TandemResult sets what AsyncResult.__init__ sets (a Celery that sets more fails
    here), with its on_ready promise made on first use, once."""
    with Client(settings=settings) as client:
        ours = TandemResult("t-1", app=client.app)
        celerys = AsyncResult("t-1", app=client.app)
        assert set(vars(celerys)) - {"on_ready"} <= set(vars(ours))
        assert (ours.id, ours.app, ours.backend, ours.parent) == (
            celerys.id, celerys.app, celerys.backend, celerys.parent,
        )  # fmt: skip
        assert "_on_ready" not in vars(ours)
        assert ours.on_ready is ours.on_ready and not ours.on_ready.ready
        with pytest.raises(ValueError, match="requires valid id"):
            TandemResult(None, app=client.app)


def test_then_calls_back_before_or_after_get_as_in_celery(settings, executor):
    """then() before get() is called back with the result; then() on a result get() has
    already is called back at once, as on a fulfilled Celery promise."""
    executor(Threads())
    with Client(settings=settings) as client:
        early, late = client.submit(MODEL, "early"), client.submit(MODEL, "late")
        seen: list = []
        early.then(lambda result: seen.append(("early", result.result)))
        assert early.get(timeout=10) == "early"
        wait_until(lambda: ("early", "early") in seen, 10, "the early callback")
        assert late.get(timeout=10) == "late"
        late.then(lambda result: seen.append(("late", result.result)))
        assert ("late", "late") in seen
        assert seen.count(("early", "early")) == 1


def test_a_plain_celery_client_reads_the_same_result(settings, executor):
    executor(Threads())
    with Client(settings=settings) as client:
        res = client.submit(MODEL, {"x": 1})
        assert AsyncResult(res.id, app=plain_celery(settings)).get(timeout=10) == {"x": 1}
        assert res.get(timeout=10) == {"x": 1}


def test_errors_states_forget_and_timeouts_are_celerys(settings, executor, r):
    executor(Threads())
    with Client(settings=settings) as client:
        bad = client.submit(MODEL, "bad")
        with pytest.raises(BadInput, match="bad inputs"):
            bad.get(timeout=10)
        assert bad.state == "FAILURE" and isinstance(bad.result, BadInput)
        assert bad.get(timeout=10, propagate=False).args == ("bad inputs",)
        bad.forget()
        assert not r.exists(keys.result(bad.id))
    # A model whose only executor is busy: its task waits in L1 and get() times out.
    table = Table(r)
    table.register("busy", "slow:1", worker="b", max_batch=4, ttl_ms=60_000, max_wait_ms=0, pid=1)
    with Client(settings=settings) as client:
        waiting = client.submit("slow:1", 1)
        with pytest.raises(CeleryTimeoutError):
            waiting.get(timeout=0.2)


def test_concurrent_getters_each_get_their_own_result(settings, executor):
    executor(Threads(base_ms=2.0))
    with Client(settings=settings) as client:
        out: dict[int, object] = {}

        def one(n: int) -> None:
            out[n] = client.submit(MODEL, [n]).get(timeout=20)

        threads = [threading.Thread(target=one, args=(n,)) for n in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert out == {n: [n] for n in range(16)}


def test_a_result_published_while_the_subscription_was_cut_is_not_lost(settings, executor, r):
    with Client(settings=settings) as client:
        Table(r).register(
            "busy", MODEL, worker="b", max_batch=4, ttl_ms=60_000, max_wait_ms=0, pid=1
        )
        res = client.submit(MODEL, "across the cut")  # waits in L1: no executor is free
        r.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        executor(Threads())  # stores the result while the listener is away
        wait_until(lambda: r.exists(keys.result(res.id)), 10, "the result stored")
        assert res.get(timeout=10) == "across the cut"


def test_tandems_connections_speak_resp2_unless_the_url_says_otherwise(settings):
    """RESP2, so the listener can read results off its connection; a URL may ask for 3."""
    for url, protocol in ((settings.redis_url, 2), (settings.redis_url + "?protocol=3", 3)):
        client = connect(url)
        try:
            assert client.ping()
            connection = client.connection_pool.get_connection()
            assert int(connection.protocol) == protocol
            client.connection_pool.release(connection)
        finally:
            client.close()
        # The HTTP gateway's asyncio client speaks the same.
        assert connect_async(url).connection_pool.connection_kwargs["protocol"] == protocol


def test_a_cut_met_while_reading_directly_is_mended_through_pubsub(settings, executor, r, caplog):
    """The subscription is read off its connection once a read went well; a cut there
    hands the next read to PubSub, which reconnects and subscribes again, and the result
    stored meanwhile is read from its key."""
    executor(Threads())
    with Client(settings=settings) as client:
        assert client.submit(MODEL, "before").get(timeout=10) == "before"
        assert client.listener._direct
        pubsub = client.listener._pubsub
        through_pubsub = []
        get_message = pubsub.get_message
        pubsub.get_message = lambda **kw: through_pubsub.append(kw) or get_message(**kw)
        for n in range(3):
            assert client.submit(MODEL, n).get(timeout=10) == n
        # Read off the connection: PubSub read at most once, for a health check due.
        assert len(through_pubsub) <= 1
        r.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        assert client.submit(MODEL, "after").get(timeout=10) == "after"
        assert "reconnecting" in caplog.text  # the direct read met the cut
        assert client.submit(MODEL, "again").get(timeout=10) == "again"
        assert client.listener._direct


def test_a_lone_task_to_an_idle_executor_stays_on_its_thread(settings, executor):
    """A tiny compute runs on the executor thread; a long one on the device thread, with
    the next batch claimed early while it computes."""
    fast = Threads()
    ex = executor(fast, max_batch=8)
    with Client(settings=settings) as client:
        for n in range(3):
            client.submit(MODEL, n).get(timeout=10)
    assert fast.threads[-1] == f"tandem {ex.id}"


def test_a_long_compute_keeps_the_device_thread_and_the_pipeline(settings, executor):
    slow = Threads(base_ms=50.0)
    executor(slow, max_batch=8)
    with Client(settings=settings) as client:
        results = client.submit_many(MODEL, list(range(17)))
        assert [res.get(timeout=20) for res in results] == list(range(17))
    assert all(name.startswith("tandem device") for name in slow.threads)
    assert len(slow.threads) == 3  # 1 (to L2), then 8 and 8, claimed while one computes


@settings_for_redis
@given(noise=st.lists(st.binary(max_size=64) | st.sampled_from(NOT_FINAL), max_size=4))
def test_anything_else_published_on_a_result_channel_is_passed_over(settings, r, noise):
    """Any bytes, or a state that is not final, published where a task's result goes: the
    waiting get() keeps waiting, and returns the result once it is stored."""
    with Client(settings=settings) as client:
        task_id = client.listener.new_id()
        client.listener.expect([task_id])
        for data in noise:
            r.publish(keys.result(task_id), data)
        stored = results.success(task_id, {"answer": 42})
        r.set(keys.result(task_id), stored)
        r.publish(keys.result(task_id), stored)
        assert client.listener.wait(task_id, 10)["result"] == {"answer": 42}


#: JSON values, and the types kombu's JSON writes with markers (Celery's backend too).
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text()
    | st.datetimes() | st.uuids() | st.decimals(allow_nan=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)  # fmt: skip


@given(JSONISH)
def test_a_result_decodes_as_celerys_backend_decodes_it(value):
    data = kombu_json.dumps({"status": "SUCCESS", "result": value}).encode()
    assert repr(results.loads(data)) == repr(kombu_json.loads(data))
    assert repr(results.loads(data.decode())) == repr(kombu_json.loads(data))


@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
))  # fmt: skip
def test_a_result_is_stored_as_json_dumps_writes_it_or_fails_alone(value):
    meta = json.loads(results.success("t-1", value))
    try:
        expected = json.dumps(value, allow_nan=False)
    except ValueError:  # NaN or infinity: not JSON
        assert meta["status"] == "FAILURE" and meta["result"]["exc_type"] == "BadInput"
    else:
        assert meta["status"] == "SUCCESS" and json.dumps(meta["result"]) == expected
