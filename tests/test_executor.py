"""One executor in this process, on the real Redis: isolation and recovery."""

from __future__ import annotations

import time

import pytest

from helpers import wait_until
from tandem.broker import keys
from tandem.broker.errors import BadInput, ModelError
from tandem.broker.faults import Faults
from tandem.broker.state import TRANSITIONS, State
from tandem.broker.table import Table
from tandem.producers.client import Client
from tandem.workers import returner
from tandem.workers.executor import Executor
from tandem.workers.heartbeat import Heartbeat
from tandem.workers.hooks import Metrics
from tandem.workers.models.sim import SimModel

MODEL = "poison:1"


class PoisonModel:
    """Doubles numbers; a batch holding the number 13 raises, as a real model bug would."""

    def __init__(self) -> None:
        self.batch_sizes: list[int] = []

    def validate(self, inputs):
        if inputs == "crash":
            raise KeyError("a validator bug")
        if not isinstance(inputs, int):
            raise BadInput("poison expects an integer")
        return inputs

    def run(self, batch):
        self.batch_sizes.append(len(batch))
        if 13 in batch:
            raise RuntimeError("unlucky")
        return [2 * x for x in batch]


@pytest.fixture
def running(settings, r):
    settings = settings.replace(max_wait_ms=300.0, max_batch=16)
    model = PoisonModel()
    executor = Executor(MODEL, model, table=Table(r), settings=settings, worker="t")
    executor.start()
    heartbeat = Heartbeat(executor.table, [executor], interval_s=0.1, ttl_s=2).start()
    wait_until(lambda: executor.state == State.IDLE, 10, "IDLE")
    client = Client(settings=settings)
    yield executor, model, client
    client.close()
    heartbeat.stop()
    executor.stop()


def test_bisection_fails_only_the_poisoned_task(running):
    executor, model, client = running
    inputs = list(range(10, 26))  # 16 tasks, 13 among them
    results = client.submit_many(MODEL, inputs)
    for value, result in zip(inputs, results, strict=True):
        if value == 13:
            with pytest.raises(ModelError, match="model raised RuntimeError: unlucky"):
                result.get(timeout=10)
        else:
            assert result.get(timeout=10) == 2 * value
    assert model.batch_sizes[0] == 16
    # The batch is counted just after its results are stored, on the executor's side.
    wait_until(lambda: executor.batches == 1, 10, "the batch to be counted")
    assert "failed=1" in repr(executor)


def test_a_reclaimed_executor_registers_again_and_keeps_serving(running, r):
    executor, _model, client = running
    assert executor.table.reclaim(executor.id, MODEL, force=True) == 0
    assert not r.exists(keys.executor(executor.id))
    wait_until(lambda: r.hget(keys.executor(executor.id), "state") == b"IDLE", 10, "re-register")
    assert client.submit(MODEL, 4).get(timeout=10) == 8


def test_a_validator_bug_fails_the_task_not_the_executor(running):
    executor, _model, client = running
    crash, fine, wrong = client.submit_many(MODEL, ["crash", 1, "text"])
    with pytest.raises(BadInput, match="inputs rejected: KeyError"):
        crash.get(timeout=10)
    with pytest.raises(BadInput, match="poison expects an integer"):
        wrong.get(timeout=10)
    assert fine.get(timeout=10) == 2
    assert executor.alive


def test_every_state_change_in_the_stream_is_one_the_transition_table_allows(settings, r):
    """Executors with and without a batch window, through low load, a burst, a reclaim
    while alive (it registers again) and a stop: each consecutive pair of states an
    executor wrote to the changes stream is in broker/state.py's TRANSITIONS."""
    executors = [
        Executor(model, SimModel(5, 0), table=Table(r), settings=settings.replace(**extra),
                 worker="t")
        for model, extra in (("sim:1", {}), ("sim:2", {"max_wait_ms": 20.0}))
    ]  # fmt: skip
    for executor in executors:
        executor.start()
    heartbeat = Heartbeat(Table(r), executors, interval_s=0.1, ttl_s=2).start()
    try:
        with Client(settings=settings) as client:
            for executor in executors:
                model = executor.model_ref
                wait_until(lambda e=executor: e.state == State.IDLE, 10, "IDLE")
                assert client.submit(model, [0]).get(timeout=10) == [0]
                burst = client.submit_many(model, [[n] for n in range(40)])
                assert [x.get(timeout=10) for x in burst] == [[n] for n in range(40)]
                Table(r).reclaim(executor.id, model, force=True)
                wait_until(lambda e=executor: r.exists(keys.executor(e.id)), 10, "register")
                assert client.submit(model, [1]).get(timeout=10) == [1]
    finally:
        heartbeat.stop()
        for executor in executors:
            executor.stop()
    changes: dict[str, list[str]] = {}
    for _, fields in r.xrange(keys.STATE_STREAM):
        changes.setdefault(fields[b"executor"].decode(), []).append(fields[b"state"].decode())
    seen = set()
    for states in changes.values():
        assert states[0] == State.WORKING  # registered
        seen |= set(zip(states, states[1:], strict=False))
    allowed = {(a, b) for a, targets in TRANSITIONS.items() for b in targets}
    assert seen <= allowed, f"not in TRANSITIONS: {sorted(seen - allowed)}"
    for needed in [("IDLE", "WAITING"), ("WAITING", "WORKING"), ("IDLE", "WORKING"),
                   ("WORKING", "IDLE"), ("GONE", "WORKING")]:  # fmt: skip
        assert needed in seen


@pytest.mark.parametrize("lost", [0, 2], ids=["counted", "a count lost"])
def test_at_low_load_each_batch_is_counted_once_after_its_results(
    settings, r, lost, monkeypatch, caplog
):
    """A task that wakes an IDLE executor has its result stored alone; the batch's
    counters follow in count.lua, once each. A Redis error on that call (lost: the nth
    count fails) loses the counts it carried and nothing else: no restart, no task."""
    monkeypatch.setattr(returner, "COUNT_EVERY_S", 0.0)  # a count per batch
    spec = f"count:before:{lost}" if lost else ""
    table = Table(r, faults=Faults(spec))
    settings = settings.replace(max_wait_ms=0.0)
    executor = Executor(
        "sim:1", SimModel(0, 0), table=table, settings=settings, worker="t", hooks=[Metrics()]
    )
    executor.start()
    done = 4
    try:
        with Client(settings=settings) as client:
            for n in range(done):
                wait_until(lambda: executor.state == State.IDLE, 10, "IDLE")
                assert client.submit("sim:1", [n]).get(timeout=10) == [n]
        counted = done - bool(lost)
        wait_until(
            lambda: r.hget(keys.executor(executor.id), "tasks") == str(counted).encode(),
            10,
            "the batches' counts",
        )
        assert executor.batches == done and executor.restarts == 0
    finally:
        executor.stop()
    metrics = r.hgetall(keys.metrics("sim:1"))
    assert metrics[b"outcome:SUCCESS"] == str(counted).encode()
    assert metrics[b"route:L2"] == str(done).encode()


def test_under_load_the_counts_of_many_batches_go_together_and_once(settings, r):
    """Each batch's bookkeeping is owed, and sent at most every COUNT_EVERY_S, and once
    the executor has nothing else to store: every counter arrives, exactly once, in far
    fewer count.lua calls than batches."""
    r.config_set("slowlog-log-slower-than", 0)
    r.config_set("slowlog-max-len", 100000)
    r.slowlog_reset()
    table = Table(r)
    settings = settings.replace(max_wait_ms=0.0, max_batch=4)
    executor = Executor(
        "sim:1", SimModel(5, 0), table=table, settings=settings, worker="t", hooks=[Metrics()]
    )
    executor.start()
    tasks = 200
    try:
        wait_until(lambda: executor.state == State.IDLE, 10, "IDLE")
        started = time.monotonic()
        with Client(settings=settings) as client:
            results = client.submit_many("sim:1", [[n] for n in range(tasks)])
            assert [res.get(timeout=30) for res in results] == [[n] for n in range(tasks)]
        wait_until(
            lambda: r.hget(keys.executor(executor.id), "tasks") == str(tasks).encode(),
            10,
            "the owed counts, sent once the executor is idle",
        )
        elapsed = time.monotonic() - started
        batches = executor.batches
        assert r.hget(keys.executor(executor.id), "batches") == str(batches).encode()
    finally:
        executor.stop()
    metrics = r.hgetall(keys.metrics("sim:1"))
    assert metrics[b"outcome:SUCCESS"] == str(tasks).encode()
    assert metrics[b"batch_size:count"] == str(batches).encode()
    sha = table.scripts.count.sha.encode()
    calls = sum(1 for e in r.slowlog_get(100000) if e["command"].split()[1:2] == [sha])
    assert batches >= tasks / 4 and calls < batches
    assert calls <= 2 + elapsed / returner.COUNT_EVERY_S


def test_a_stopped_executor_sends_the_counts_it_owes(settings, r, monkeypatch):
    """A stop (scale-in) sends the bookkeeping still owed before the executor ends."""
    monkeypatch.setattr(returner, "COUNT_EVERY_S", 3600.0)  # only the first batch's goes
    settings = settings.replace(max_wait_ms=0.0, max_batch=4)
    executor = Executor(
        "sim:1", SimModel(2, 0), table=Table(r), settings=settings, worker="t", hooks=[Metrics()]
    )
    executor.start()
    try:
        with Client(settings=settings) as client:
            results = client.submit_many("sim:1", [[n] for n in range(40)])
            assert [res.get(timeout=30) for res in results] == [[n] for n in range(40)]
        assert int(r.hget(keys.metrics("sim:1"), "outcome:SUCCESS") or 0) < 40
        assert r.hget(keys.metrics("sim:1"), "stored") == b"40"  # counted with the results
    finally:
        executor.stop()
    assert r.hget(keys.metrics("sim:1"), "outcome:SUCCESS") == b"40"
    assert r.hget(keys.executor(executor.id), "tasks") in (None, b"40")  # gone, or counted
