"""Fleet-scale behaviour with real workers: no executor polls to be served, a batch
window closes when the batch is full, several executors of one model in one worker."""

from __future__ import annotations

from helpers import executors_of, plain_celery, wait_until
from tandem.broker import keys
from tandem.broker.table import Table
from tandem.producers.client import Client


def test_the_coordinator_feeds_plain_celery_tasks_to_an_executor_that_never_polls(
    processes, settings, r
):
    """poll_ms is an hour: only the coordinator's feed can hand the task on."""
    processes.worker("w1", poll_ms=3_600_000.0)
    processes.coordinator()
    app = plain_celery(settings)
    result = app.send_task(
        "tandem.infer", kwargs={"model": "sim:1", "inputs": [7]}, queue=keys.l1("sim:1")
    )
    assert result.get(timeout=30) == [7]
    # Without a batch window the task's route:L2 count comes with the executor's next
    # step, just after the result is out (settle_route in _lib.lua).
    wait_until(
        lambda: r.hget(keys.metrics("sim:1"), "route:L2") == b"1", 10, "the task counted in L2"
    )


def test_a_full_batch_does_not_wait_out_its_window(processes, settings, r):
    """The window is an hour long; four tasks fill max_batch 4, and route.lua's word on
    the full channel starts the batch."""
    processes.worker("w1", max_wait_ms=3_600_000.0, max_batch=4)
    with Client(settings=settings) as client:
        results = client.submit_many("sim:1", [[n] for n in range(4)])
        assert [x.route for x in results] == ["L2"] * 4
        assert [x.get(timeout=30) for x in results] == [[n] for n in range(4)]
    # The batch is counted just after its results are out (count.lua, at low load).
    wait_until(lambda: executors_of(r, "w1")[0].tasks == 4, 10, "the batch counted")
    (executor,) = executors_of(r, "w1")
    assert (executor.batches, executor.tasks) == (1, 4)


def test_a_worker_hosts_several_executors_of_one_model_when_asked(processes, settings, r):
    processes.worker("w1", executors_per_model=5)
    executors = executors_of(r, "w1")
    assert len({e.id for e in executors}) == 5
    with Client(settings=settings) as client:
        results = client.submit_many("sim:1", [[n] for n in range(5)])
        assert len({x.executor for x in results}) == 5  # one each: the longest idle first
        assert [x.get(timeout=30) for x in results] == [[n] for n in range(5)]
    wait_until(lambda: sum(e.tasks for e in Table(r).executors("sim:1")) == 5, 10, "all stored")
