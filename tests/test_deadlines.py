"""Deadline-aware serving: the latency model, the batch plan, shedding at claim and
refusing at submit. Pure logic where it is pure; a real Redis, real executors (threads,
the code a worker runs) and real Celery clients and events everywhere else."""

from __future__ import annotations

import contextlib
import math
import random
import threading
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from helpers import plain_celery, wait_until
from tandem.broker import keys, message
from tandem.broker.app import make_app
from tandem.broker.errors import DeadlineExceeded, Overloaded
from tandem.broker.table import Table
from tandem.coordinator.exporter import Collector
from tandem.producers.client import Client
from tandem.workers.deadlines import plan
from tandem.workers.executor import Executor
from tandem.workers.heartbeat import Heartbeat
from tandem.workers.hooks import CeleryEvents, Logs, Metrics
from tandem.workers.latency import LatencyModel
from tandem.workers.models.sim import SimModel
from tandem.workers.prepare import Preparer

MODEL = "dl:1"


# The latency model (pure logic)


def test_the_latency_model_learns_a_line_and_follows_a_change_of_speed():
    rng = random.Random(3)
    latency = LatencyModel()
    for _ in range(200):
        n = rng.randint(1, 32)
        latency.observe_compute(n, 20 + 0.5 * n + rng.uniform(0, 1))
    base, per_item = latency.line()
    assert base == pytest.approx(20.5, abs=0.5) and per_item == pytest.approx(0.5, abs=0.05)
    assert 0 < latency.margin_ms <= 1.0  # the tail of the noise, no more
    for _ in range(200):  # the device got twice as slow
        n = rng.randint(1, 32)
        latency.observe_compute(n, 40 + 1.0 * n)
    base, per_item = latency.line()
    assert base == pytest.approx(40, abs=1) and per_item == pytest.approx(1.0, abs=0.05)
    assert latency.finish_ms(32) >= 40 + 32


def test_the_published_speed_counts_the_wait_for_the_compute_in_hand():
    latency = LatencyModel()
    for n in (1, 32, 1, 32):
        latency.observe_compute(n, 10 + n)
    latency.observe_gap(2.0)
    latency.observe_return(3.0)
    piped, serial = latency.speed(32, pipeline=True), latency.speed(32, pipeline=False)
    assert piped.rate == serial.rate == pytest.approx(32 * 1000 / (42 + 2))
    assert piped.lag_ms == serial.lag_ms == pytest.approx(2 + 42 + 3)
    # A batch claimed early waits for the compute in hand (42 ms) before its own.
    assert (piped.extra_ms, serial.extra_ms) == (pytest.approx(42), 0)


# The batch plan (pure logic, any input)

deadline_lists = st.lists(
    st.one_of(st.none(), st.floats(0, 10, allow_nan=False)), min_size=0, max_size=40
)


@given(
    deadlines=deadline_lists,
    priorities=st.lists(st.integers(0, 9), min_size=40, max_size=40),
    base=st.floats(0, 3),
    per_item=st.floats(0, 0.5),
)
def test_the_plan_computes_the_most_tasks_that_meet_their_deadlines(
    deadlines, priorities, base, per_item
):
    priorities = priorities[: len(deadlines)]

    def finish(n: int) -> float:
        return base + per_item * n

    out = plan(deadlines, priorities, finish)
    everything = sorted(out.keep + out.shed + out.back)
    assert everything == list(range(len(deadlines)))  # each task in exactly one place
    size = len(out.keep)
    # Every kept task meets its deadline in a batch of that size ...
    assert all(deadlines[i] is None or deadlines[i] >= finish(size) for i in out.keep)
    # ... and no larger batch would have had as many tasks meet theirs.
    for n in range(size + 1, len(deadlines) + 1):
        assert sum(d is None or d >= finish(n) for d in deadlines) < n
    # A shed task would have missed; one handed back would have made it.
    assert all(deadlines[i] is not None and deadlines[i] < out.finish for i in out.shed)
    assert all(deadlines[i] is None or deadlines[i] >= out.finish for i in out.back)
    # Priority 0 is kept first, then the earliest deadline.
    if out.keep and out.back:

        def rank(i):
            return priorities[i], math.inf if deadlines[i] is None else deadlines[i]

        assert max(rank(i) for i in out.keep) <= min(rank(i) for i in out.back)
    if all(d is None for d in deadlines):
        assert out.keep == list(range(len(deadlines)))


# The prepare stage on a real Redis, with a latency model told the costs


class Echo:
    def __init__(self) -> None:
        self.validated: list = []

    def validate(self, inputs):
        self.validated.append(inputs)
        return inputs

    def run(self, batch):
        return list(batch)


def learned(base_ms: float, per_item_ms: float) -> LatencyModel:
    latency = LatencyModel()
    for n in (1, 8, 1, 8):
        latency.observe_compute(n, base_ms + per_item_ms * n)
    return latency


@pytest.fixture
def queued(settings, r):
    """A Preparer of a registered, working executor, and a Client whose tasks wait in L1."""
    table = Table(r)
    table.register("busy", MODEL, worker="b", max_batch=8, ttl_ms=60_000, max_wait_ms=0, pid=1)
    table.register("prep", MODEL, worker="p", max_batch=8, ttl_ms=60_000, max_wait_ms=0, pid=1)
    client = Client(settings=settings)
    model = Echo()

    def preparer(latency: LatencyModel, *, aware: bool = True, slo_ms: float = 0) -> Preparer:
        return Preparer(
            "prep",
            MODEL,
            model,
            table,
            8,
            1 << 20,
            latency=latency,
            slo_ms=slo_ms,
            deadline_aware=aware,
        )

    yield client, table, preparer, model
    client.close()


def claim_and_prepare(table: Table, preparer: Preparer):
    return preparer.batch(table.claim("prep", MODEL, 8), revocations=False)


def test_a_batch_sheds_what_would_miss_and_computes_the_rest(queued):
    client, table, preparer, model = queued
    tight = client.submit_many(MODEL, ["t0", "t1"], deadline_s=0.4)
    loose = client.submit_many(MODEL, ["l0", "l1", "l2"], deadline_s=60)
    tasks = claim_and_prepare(table, preparer(learned(1000, 0)))  # a batch takes 1 s
    by_input = {task.inputs: task for task in tasks}
    for name in ("t0", "t1"):
        assert isinstance(by_input[name].error, DeadlineExceeded)
        assert "would miss its deadline by" in str(by_input[name].error)
    assert all(by_input[name].error is None for name in ("l0", "l1", "l2"))
    assert {t.id for t in tight} | {t.id for t in loose} == {t.id for t in tasks}
    assert table.l1_depth(MODEL) == 0
    assert model.validated == ["l0", "l1", "l2"]  # a shed task costs no validate()


def test_a_flood_of_tasks_that_all_miss_is_shed_a_bounded_batch_at_a_time(queued):
    client, table, preparer, model = queued
    prep = preparer(learned(1000, 0))
    client.submit_many(MODEL, list(range(prep.held_max + 100)), deadline_s=0.4)
    tasks = claim_and_prepare(table, prep)
    assert len(tasks) == prep.held_max
    assert all(isinstance(task.error, DeadlineExceeded) for task in tasks)
    assert table.l1_depth(MODEL) == 100 and not model.validated


def test_priority_zero_is_kept_and_the_rest_goes_back_to_the_head_of_l1(queued):
    client, table, preparer, _ = queued
    # 1 s + 2 s a task: by 10 s a batch of at most 4 is stored (9 s; 5 would take 11 s).
    client.submit_many(MODEL, [f"low{n}" for n in range(4)], priority=9, deadline_s=10)
    client.submit_many(MODEL, [f"urgent{n}" for n in range(4)], priority=0, deadline_s=10)
    client.submit(MODEL, "later", priority=9, deadline_s=60)
    tasks = claim_and_prepare(table, preparer(learned(1000, 2000)))
    assert [task.inputs for task in tasks] == [f"urgent{n}" for n in range(4)]
    assert all(task.error is None for task in tasks)
    # The low-priority tasks would have made it but did not fit: they wait again at the
    # head of L1, in order, before the task that came after them. None was shed.
    back = [message.decode(raw, max_bytes=1 << 20).inputs for raw in table.claim("prep", MODEL, 8)]
    assert back == ["low0", "low1", "low2", "low3", "later"]


def test_without_deadline_awareness_only_the_expired_fail_unrun(queued):
    client, table, preparer, _ = queued
    client.submit_many(MODEL, ["t0", "t1"], deadline_s=0.4)
    gone = client.submit(MODEL, "gone", deadline_s=1e-6)  # expired at once
    tasks = claim_and_prepare(table, preparer(learned(1000, 0), aware=False))
    failed = {task.id: task.error for task in tasks if task.error is not None}
    assert list(failed) == [gone.id] and "task expired at" in str(failed[gone.id])
    assert sorted(task.inputs for task in tasks if task.error is None) == ["t0", "t1"]


def test_a_task_without_a_deadline_takes_the_model_slo(queued):
    client, table, preparer, _ = queued
    own = client.submit(MODEL, "own", deadline_s=60)
    default = client.submit(MODEL, "default")
    tasks = claim_and_prepare(table, preparer(learned(1000, 0), slo_ms=300))
    errors = {task.id: task.error for task in tasks}
    assert errors[own.id] is None
    assert isinstance(errors[default.id], DeadlineExceeded)


# A real executor: shedding at claim, refusing at submit


class Gated(SimModel):
    """sim with a gate: while it is closed, a batch waits for it before computing."""

    def __init__(self, base_ms: float) -> None:
        super().__init__(base_ms=base_ms, per_item_ms=0.0)
        self.open = threading.Event()
        self.open.set()
        self.entered = threading.Event()
        self.computed: list = []

    def run(self, batch):
        self.entered.set()
        self.open.wait(30)
        self.computed.extend(batch)
        return super().run(batch)


class Events(threading.Thread):
    """Celery task events of the test Redis, as Flower receives them."""

    def __init__(self, app) -> None:
        super().__init__(daemon=True)
        self.app = app
        self.failed: dict[str, str] = {}
        self.ready = threading.Event()
        self.receiver = None

    def run(self) -> None:
        with self.app.connection_for_read() as connection:
            self.receiver = self.app.events.Receiver(
                connection,
                handlers={"task-failed": self._failed, "*": lambda event: None},
            )
            self.ready.set()
            self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def close(self) -> None:
        """The receiver looks at should_stop between waits of a second."""
        self.receiver.should_stop = True
        self.join(10)

    def _failed(self, event) -> None:
        self.failed[event["uuid"]] = event["exception"]


@pytest.fixture
def gated(settings, r):
    """A warmed-up executor of a 250 ms model, its speed published; close the gate to
    keep it busy."""
    model = Gated(base_ms=250)
    app = make_app(settings)
    executors: list = []

    def start(**overrides) -> Executor:
        mine = settings.replace(max_batch=8, **overrides)
        hooks = [Logs(), Metrics(), CeleryEvents(app, "gated@test")]
        executor = Executor(MODEL, model, table=Table(r), settings=mine, worker="g", hooks=hooks)
        executor.start()
        beat = Heartbeat(executor.table, [executor], interval_s=0.2, ttl_s=5).start()
        executors.append((executor, beat))
        with Client(settings=settings) as client:
            for n in range(3):
                client.submit(MODEL, f"warm{n}", deadline_s=30).get(timeout=10)
        model.computed.clear()
        return executor

    yield model, start
    model.open.set()
    for executor, beat in executors:
        beat.stop()
        executor.stop()


def scrape(r) -> dict:
    """What the coordinator's Prometheus exporter serves now: (name, labels) -> value."""
    return {
        (sample.name, tuple(sample.labels.values())): sample.value
        for family in Collector(r).collect()
        for sample in family.samples
    }


def busy(model: Gated, client: Client):
    """Close the gate and hand the executor a task: it computes until the gate opens."""
    model.open.clear()
    model.entered.clear()
    result = client.submit(MODEL, "gate", deadline_s=60)
    assert model.entered.wait(10)
    return result


def test_plain_celery_expires_is_shed_by_prediction_with_a_failure_and_its_event(
    settings, r, gated
):
    model, start = gated
    start()
    events = Events(make_app(settings))
    events.start()
    assert events.ready.wait(10)
    plain = plain_celery(settings)
    with Client(settings=settings) as client, contextlib.closing(events):
        gate = busy(model, client)

        def send(name: str, seconds: float):
            return plain.send_task(
                "tandem.infer",
                kwargs={"model": MODEL, "inputs": name},
                queue=keys.l1(MODEL),
                expires=datetime.now(timezone.utc) + timedelta(seconds=seconds),
            )

        # The gate's batch ends 250 ms after the gate opens, when these are claimed; each
        # then needs 250 ms more. 370 ms is too little (though not past at the claim), and
        # 30 s is plenty.
        tight = [send(f"tight{n}", 0.37) for n in range(3)]
        loose = [send(f"loose{n}", 30) for n in range(3)]
        wait_until(lambda: Table(r).l1_depth(MODEL) == 6, 10, "the tasks in L1")
        model.open.set()
        gate.get(timeout=10)
        assert [res.get(timeout=10) for res in loose] == ["loose0", "loose1", "loose2"]
        for res in tight:
            with pytest.raises(DeadlineExceeded, match="would miss its deadline by"):
                res.get(timeout=10)
        # Each has its FAILURE stored and its event sent.
        wait_until(lambda: {res.id for res in tight} <= set(events.failed), 10, "the events")
    assert not [x for x in model.computed if str(x).startswith("tight")]
    # Nothing is left in any list.
    assert all("DeadlineExceeded" in events.failed[res.id] for res in tight)
    table = Table(r)
    (executor,) = table.executors(MODEL)
    assert table.l1_depth(MODEL) == executor.l2_depth == executor.inflight_depth == 0
    # The batch's counters follow its results (workers/returner.py).
    wait_until(
        lambda: r.hget(keys.metrics(MODEL), "failure:DeadlineExceeded") == b"3", 10, "the counts"
    )


def test_submit_refuses_at_once_what_the_wait_would_make_late(settings, r, gated):
    model, start = gated
    start(slo_ms=50)
    table = Table(r)
    with Client(settings=settings) as client:
        gate = busy(model, client)
        speed = wait_until(lambda: table.speed(MODEL), 10, "a published speed")
        with pytest.raises(Overloaded) as refused:
            client.submit(MODEL, "late", deadline_s=0.1)
        assert refused.value.wait_s > refused.value.deadline_s
        assert refused.value.deadline_s == pytest.approx(0.1, abs=0.05)
        assert refused.value.wait_s * 1000 == pytest.approx(speed.wait_ms(0), abs=1)
        # The model's SLO (50 ms) stands in for a deadline of its own ...
        with pytest.raises(Overloaded):
            client.submit(MODEL, "default")
        assert table.l1_depth(MODEL) == 0  # nothing was enqueued
        # ... which overrides it.
        accepted = client.submit(MODEL, "in time", deadline_s=30)
        assert table.l1_depth(MODEL) == 1
        assert int(r.hget(keys.metrics(MODEL), "shed:submit")) == 2
        scraped = scrape(r)
        assert scraped[("tandem_tasks_shed_total", (MODEL, "submit"))] == 2
        assert scraped[("tandem_capacity", (MODEL,))] == pytest.approx(speed.rate)
        assert scraped[("tandem_predicted_wait_ms", (MODEL,))] == pytest.approx(
            speed.wait_ms(1)  # the task in L1 now is ahead of the next one
        )
        model.open.set()
        gate.get(timeout=10)
        assert accepted.get(timeout=10) == "in time"


def test_priority_zero_is_refused_last(settings, r, gated):
    model, start = gated
    start()
    table = Table(r)
    with Client(settings=settings) as client:
        gate = busy(model, client)
        speed = wait_until(lambda: table.speed(MODEL), 10, "a published speed")
        client.submit_many(MODEL, [f"low{n}" for n in range(40)], priority=9, deadline_s=60)
        # A deadline between the waits predicted behind 0 and behind 40 tasks.
        between = (speed.wait_ms(0) + speed.wait_ms(40)) / 2000
        with pytest.raises(Overloaded):
            client.submit(MODEL, "low", priority=9, deadline_s=between)
        urgent = client.submit(MODEL, "urgent", priority=0, deadline_s=between)
        model.open.set()
        gate.get(timeout=10)
        assert urgent.get(timeout=10) == "urgent"


def test_turned_off_it_computes_what_is_not_yet_expired(settings, r, gated):
    model, start = gated
    start(deadline_aware=False)
    table = Table(r)
    with Client(settings=settings) as client:
        gate = busy(model, client)
        assert table.speed(MODEL) is None  # nothing published, nothing predicted
        # A compute takes 250 ms: claimed as the gate's batch ends, it ends after 400 ms.
        late = client.submit(MODEL, "late", deadline_s=0.4)  # no Overloaded
        model.open.set()
        gate.get(timeout=10)
        # Claimed before its deadline, it is computed, though it ends after it.
        assert late.get(timeout=10) == "late"
    wait_until(lambda: r.hget(keys.metrics(MODEL), "deadline:missed") == b"1", 10, "the count")


def test_the_latency_model_fitted_against_sim_gives_its_costs_back(settings, r):
    model = SimModel(base_ms=20, per_item_ms=2)
    executor = Executor(
        "sim:1", model, table=Table(r), settings=settings.replace(max_batch=32), worker="s"
    )
    executor.start()
    beat = Heartbeat(executor.table, [executor], interval_s=0.2, ttl_s=5).start()
    try:
        with Client(settings=settings) as client:
            # Each burst: its first task goes straight to the idle executor, the rest wait
            # in L1 and make the next batch, so batches of 1 and of 1 to 16 alternate.
            for size in range(2, 18):
                for res in client.submit_many("sim:1", list(range(size))):
                    res.get(timeout=10)
        base, per_item = executor.latency.line()
        assert base == pytest.approx(20, abs=6) and per_item == pytest.approx(2, abs=0.6)
        (row,) = Table(r).executors("sim:1")  # as published for route.lua and Prometheus
        assert row.base_ms == pytest.approx(base, rel=0.25)
        assert row.rate == pytest.approx(Table(r).speed("sim:1").rate)
        assert 0 < row.rate <= 32 * 1000 / (20 + 2 * 32) * 1.3
    finally:
        beat.stop()
        executor.stop()
    assert Table(r).speed("sim:1") is None  # a stopped executor takes its rate out


def test_the_executor_follows_its_model_when_it_slows_down(settings, r):
    model = SimModel(base_ms=10, per_item_ms=0)
    executor = Executor("sim:1", model, table=Table(r), settings=settings, worker="s")
    executor.start()
    beat = Heartbeat(executor.table, [executor], interval_s=0.2, ttl_s=5).start()
    try:
        with Client(settings=settings) as client:
            for n in range(5):
                client.submit("sim:1", n).get(timeout=10)
            fast = Table(r).speed("sim:1").rate
            model.base_ms = 40  # the device is now 4 times slower
            for n in range(40):
                client.submit("sim:1", n).get(timeout=10)
        assert executor.latency.compute_ms(1) == pytest.approx(40, abs=8)
        assert Table(r).speed("sim:1").rate < fast / 2
    finally:
        beat.stop()
        executor.stop()


def test_the_speed_hash_sums_the_live_executors_and_route_predicts_as_python_does(settings, r):
    """Scripts keep the sums exact through publish, STOPPING and reclaim; route.lua's
    prediction is ModelSpeed.wait_ms, below and above the batches claimed early."""
    from tandem.broker.state import Speed, State

    table = Table(r)
    for name in ("a", "b"):
        table.register(name, MODEL, worker=name, max_batch=8, ttl_ms=60_000, max_wait_ms=0, pid=1)

    def publish(name: str, rate: float, lag: float, extra: float) -> None:
        speed = Speed(1.0, 0.5, 0.2, rate=rate, lag_ms=lag, max_batch=8, extra_ms=extra)
        table.count_batch(name, MODEL, 0, batches=0, speed=speed)

    publish("a", 100, 40, 10)
    publish("b", 300, 20, 30)
    publish("b", 300, 20, 30)  # published again: replaced, not added
    speed = table.speed(MODEL)
    assert (speed.rate, speed.held, speed.batch) == (400, 16, 8)
    assert speed.lag_ms == pytest.approx((100 * 40 + 300 * 20) / 400)
    assert speed.extra_ms == pytest.approx((100 * 10 + 300 * 30) / 400)
    client = Client(settings=settings)
    try:
        for ahead in (0, 5, 40):
            while table.ahead(MODEL) < ahead:
                client.submit(MODEL, "x", deadline_s=60)
            with pytest.raises(Overloaded) as refused:
                client.submit(MODEL, "late", deadline_s=0.001)
            assert refused.value.ahead == ahead
            assert refused.value.wait_s * 1000 == pytest.approx(speed.wait_ms(ahead), abs=1)
    finally:
        client.close()
    table.set_state("a", MODEL, State.STOPPING)
    assert table.speed(MODEL).rate == 300 and table.speed(MODEL).held == 8
    table.reclaim("b", MODEL, force=True)
    assert table.speed(MODEL) is None and not r.exists(keys.speed(MODEL))
