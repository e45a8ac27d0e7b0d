"""Deadlines and priorities, on an executor in this process and a real Redis."""

from __future__ import annotations

import pytest

from helpers import plain_celery, wait_until
from tandem.broker import keys, message
from tandem.broker.errors import DeadlineExceeded
from tandem.broker.table import Table
from tandem.producers.client import Client
from tandem.workers.executor import Executor
from tandem.workers.heartbeat import Heartbeat

MODEL = "rec:1"


class Recorder:
    """Echoes inputs and records every batch it computes."""

    def __init__(self) -> None:
        self.batches: list[list] = []

    def validate(self, inputs):
        return inputs

    def run(self, batch):
        self.batches.append(list(batch))
        return list(batch)


@pytest.fixture
def backlog(settings, r):
    """A model whose only executor is busy, so that submitted tasks wait in L1."""
    table = Table(r)
    table.register("busy", MODEL, worker="b", max_batch=4, ttl_ms=60_000, max_wait_ms=0, pid=1)
    return Client(settings=settings)


def start_executor(settings, r, model) -> tuple[Executor, Heartbeat]:
    executor = Executor(
        MODEL, model, table=Table(r), settings=settings.replace(max_batch=4), worker="t"
    )
    executor.start()
    return executor, Heartbeat(executor.table, [executor], interval_s=0.2, ttl_s=5).start()


def test_expired_tasks_never_compute_nor_take_a_batch_slot(settings, r, backlog):
    expired = [backlog.submit(MODEL, f"late{n}", deadline_s=1e-6) for n in range(4)]
    fresh = [backlog.submit(MODEL, f"ok{n}") for n in range(4)]
    model = Recorder()
    executor, heartbeat = start_executor(settings, r, model)
    try:
        assert [res.get(timeout=10) for res in fresh] == [f"ok{n}" for n in range(4)]
        for res in expired:
            with pytest.raises(DeadlineExceeded, match="task expired at"):
                res.get(timeout=10)
        assert model.batches == [["ok0", "ok1", "ok2", "ok3"]]
    finally:
        heartbeat.stop()
        executor.stop()
        backlog.close()


def test_higher_priorities_are_served_first(settings, r, backlog):
    low = backlog.submit_many(MODEL, [f"low{n}" for n in range(4)], priority=9)
    normal = backlog.submit_many(MODEL, [f"normal{n}" for n in range(2)], priority=3)
    urgent = backlog.submit_many(MODEL, [f"urgent{n}" for n in range(2)], priority=0)
    plain = plain_celery(backlog.settings).send_task(
        "tandem.infer",
        kwargs={"model": MODEL, "inputs": "plain-urgent"},
        queue=keys.l1(MODEL),
        priority=0,
    )
    wait_until(lambda: Table(r).l1_depth(MODEL) == 9, 10, "the backlog in L1")
    model = Recorder()
    executor, heartbeat = start_executor(settings, r, model)
    try:
        for res in [*low, *normal, *urgent, plain]:
            res.get(timeout=10)
        assert model.batches == [
            ["urgent0", "urgent1", "plain-urgent", "normal0"],
            ["normal1", "low0", "low1", "low2"],
            ["low3"],
        ]
    finally:
        heartbeat.stop()
        executor.stop()
        backlog.close()


def test_kombu_would_file_each_priority_in_the_same_list(settings):
    """Plain Celery publishers and tandem agree on where a priority goes."""
    from kombu import Connection

    with Connection(settings.redis_url) as connection:
        channel = connection.default_channel
        for priority in range(10):
            key = channel._q_for_pri(keys.l1(MODEL), priority)
            assert key == keys.l1_for_priority(MODEL, priority)
    _, envelope = message.encode(MODEL, 1, queue=keys.l1(MODEL), priority=7)
    assert '"priority":7' in envelope
