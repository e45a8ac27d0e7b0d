"""End to end: real worker processes, a real coordinator, a real Redis."""

from __future__ import annotations

import json
import signal
import threading

import pytest

from helpers import executors_of, plain_celery, wait_until
from tandem.broker import keys
from tandem.broker.errors import BadInput, UnknownModel
from tandem.broker.table import Table
from tandem.producers.client import Client
from tandem.workers.models.tiny import TinyModel


@pytest.fixture
def client(settings, r):
    with Client(settings=settings) as c:
        yield c


def test_at_a_low_rate_tasks_go_to_l2_and_run_alone(processes, client, r):
    processes.worker("w1")
    processes.worker("w2")
    results = []
    for n in range(20):
        result = client.submit("sim:1", {"n": n})
        assert result.get(timeout=10) == {"n": n}
        results.append(result)
    assert {res.route for res in results} == {"L2"}

    def counted() -> bool:  # a low-load batch is counted just after its result goes out
        executors = Table(r).executors("sim:1")
        return sum(e.tasks for e in executors) == sum(e.batches for e in executors) == 20

    wait_until(counted, 10, "every batch counted, each of one task")


def test_under_a_burst_tasks_go_to_l1_and_batch(processes, client, r):
    processes.worker("w1")
    processes.worker("w2")
    results = client.submit_many("sim:1", [[n] for n in range(300)])
    assert [res.get(timeout=30) for res in results] == [[n] for n in range(300)]
    routes = [res.route for res in results]
    assert routes.count("L2") == 2  # one to each IDLE executor, which then computes
    assert routes.count("L1") == 298
    # The two woken batches are counted just after their results go out.
    wait_until(
        lambda: sum(e.tasks for e in Table(r).executors("sim:1")) == 300, 10, "every task counted"
    )
    executors = Table(r).executors("sim:1")
    assert sum(e.tasks for e in executors) / sum(e.batches for e in executors) > 1


def test_every_task_gets_its_own_result_under_concurrency(processes, client, settings):
    models = ("sim:1", "tiny:1")
    processes.worker("w1", models=models, max_wait_ms=5.0)
    processes.worker("w2", models=models)
    reference = TinyModel(device="cpu")
    failures: list[str] = []

    def produce(seed: int) -> None:
        pending = []
        for n in range(40):
            sim_input = {"seed": seed, "n": n}
            tiny_input = [float(seed), float(n), 1.0, -1.0, 0.5, 0.25, 2.0, float(n % 3)]
            pending.append((client.submit("sim:1", sim_input), sim_input))
            pending.append((client.submit("tiny:1", tiny_input), reference.reference(tiny_input)))
        for result, expected in pending:
            got = result.get(timeout=30)
            if got != pytest.approx(expected, abs=1e-5):
                failures.append(f"{result.id}: {got} != {expected}")

    threads = [threading.Thread(target=produce, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def test_a_killed_worker_loses_nothing(processes, client, r):
    processes.coordinator()
    processes.worker("w1", sim_base_ms=300.0)
    processes.worker("w2", sim_base_ms=300.0)
    results = client.submit_many("sim:1", [[n] for n in range(150)])
    victim = wait_until(
        lambda: [e for e in executors_of(r, "w1") if e.state == "WORKING" and e.inflight_depth],
        30,
        "w1 mid-batch",
    )[0]
    processes.started[1].send_signal(signal.SIGKILL)
    assert [res.get(timeout=60) for res in results] == [[n] for n in range(150)]
    wait_until(lambda: not r.exists(keys.executor(victim.id)), 10, "the victim reclaimed")
    assert "missed its heartbeat" in processes.log("coordinator")
    assert r.llen(keys.inflight(victim.id)) == 0


def test_a_graceful_stop_loses_nothing(processes, client, r):
    """No coordinator runs here: the stopping worker itself must hand everything back."""
    w1 = processes.worker("w1", sim_base_ms=100.0)
    processes.worker("w2", sim_base_ms=100.0)
    results = client.submit_many("sim:1", [[n] for n in range(150)])
    wait_until(lambda: any(e.state == "WORKING" for e in executors_of(r, "w1")), 30, "w1 busy")
    w1.send_signal(signal.SIGTERM)
    assert w1.wait(30) == 0
    assert executors_of(r, "w1") == []
    assert [res.get(timeout=60) for res in results] == [[n] for n in range(150)]
    assert "handed" in processes.log("w1")


def test_a_bad_task_fails_alone_and_the_executor_keeps_running(processes, client, r, settings):
    processes.worker("w1", models=("tiny:1",), max_wait_ms=500.0)
    good = [float(n) for n in range(8)]
    results = client.submit_many("tiny:1", [good, [1.0, 2.0], good, "text", good])
    plain = plain_celery(settings).send_task(
        "tandem.infer", kwargs={"model": "nope:1", "inputs": good}, queue="tandem.l1.tiny.1"
    )
    expected = TinyModel(device="cpu").reference(good)
    for n in (0, 2, 4):
        assert results[n].get(timeout=10) == pytest.approx(expected, abs=1e-5)
    with pytest.raises(BadInput, match="tiny expects a list of 8 numbers, got a list of 2"):
        results[1].get(timeout=10)
    with pytest.raises(BadInput, match="got str"):
        results[3].get(timeout=10)
    with pytest.raises(Exception, match="asks for model 'nope:1'") as info:
        plain.get(timeout=10)
    assert type(info.value).__name__ == "UnknownModel"
    wait_until(lambda: executors_of(r, "w1")[0].tasks == 6, 10, "the batch counted")
    (executor,) = executors_of(r, "w1")
    assert (executor.batches, executor.tasks) == (1, 6)
    assert client.submit("tiny:1", good).get(timeout=10) == pytest.approx(expected, abs=1e-5)


def test_malformed_and_pickle_messages_fail_clearly(processes, client, r):
    processes.worker("w1")
    queue = keys.l1("sim:1")
    r.lpush(queue, b"\x80\x04 not json")
    envelope = {
        "body": "gASVCAAAAAAAAACMBHBpY2tslC4=",
        "content-type": "application/x-python-serialize",
        "content-encoding": "binary",
        "headers": {"id": "pickled", "task": "tandem.infer"},
        "properties": {"body_encoding": "base64", "priority": 0},
    }
    r.lpush(queue, json.dumps(envelope))
    wait_until(lambda: r.llen(keys.DEAD) == 1, 10, "the malformed message dead-lettered")
    meta = json.loads(wait_until(lambda: r.get(keys.result("pickled")), 10, "pickle refused"))
    assert meta["status"] == "FAILURE"
    assert (
        "content type 'application/x-python-serialize' refused" in meta["result"]["exc_message"][0]
    )
    assert client.submit("sim:1", [1]).get(timeout=10) == [1]


def test_submitting_to_an_unknown_model_raises_and_enqueues_nothing(processes, client, r):
    processes.worker("w1")
    with pytest.raises(UnknownModel, match="no worker serves resnet:1") as refused:
        client.submit("resnet:1", [1])
    # The refusal says it all: no Redis error chained under it in a traceback.
    assert refused.value.__cause__ is None and refused.value.__suppress_context__
    assert Table(r).l1_depth("resnet:1") == 0
    with pytest.raises(ValueError, match="NAME:VERSION"):
        client.submit("no-version", [1])


def test_a_plain_celery_client_works(processes, settings):
    processes.worker("w1", models=("sim:1", "tiny:1"))
    app = plain_celery(settings)
    result = app.send_task(
        "tandem.infer", kwargs={"model": "sim:1", "inputs": {"a": [1, 2]}}, queue="tandem.l1.sim.1"
    )
    assert result.get(timeout=10) == {"a": [1, 2]}
    bad = app.send_task(
        "tandem.infer", kwargs={"model": "tiny:1", "inputs": [1]}, queue="tandem.l1.tiny.1"
    )
    with pytest.raises(Exception, match="tiny expects a list of 8 numbers") as info:
        bad.get(timeout=10)
    assert type(info.value).__name__ == "BadInput"
    expired = app.send_task(
        "tandem.infer", kwargs={"model": "sim:1", "inputs": 1}, queue="tandem.l1.sim.1", expires=-1
    )
    with pytest.raises(Exception, match="expired"):
        expired.get(timeout=10)


def test_the_ordinary_celery_consumer_reads_neither_l1_nor_l2(processes, settings):
    processes.worker("w1")
    inspector = plain_celery(settings).control.inspect(destination=["w1@test"], timeout=5)
    queues = wait_until(inspector.active_queues, 20, "the worker to answer")
    assert [q["name"] for q in queues["w1@test"]] == ["tandem.ctl"]
    stats = inspector.stats()["w1@test"]
    assert stats["tandem"][0]["model"] == "sim:1"
