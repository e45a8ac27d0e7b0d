"""One executor in this process, on the real Redis: isolation and recovery."""

from __future__ import annotations

import pytest

from helpers import wait_until
from tandem.broker import keys
from tandem.broker.errors import BadInput, ModelError
from tandem.broker.state import State
from tandem.broker.table import Table
from tandem.producers.client import Client
from tandem.workers.executor import Executor
from tandem.workers.heartbeat import Heartbeat

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
