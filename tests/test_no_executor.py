"""A model with no live executor gets one answer everywhere: a task with a deadline is
refused at once (Overloaded), one without waits in L1 durably, `tandem status` says no
executor serves the queue, and `tandem purge` empties it, answering each task REVOKED."""

from __future__ import annotations

import json
import math
import signal

import pytest
from celery.exceptions import TaskRevokedError

from helpers import tandem, wait_until
from tandem.broker.errors import BadArgument, Overloaded
from tandem.broker.table import Table
from tandem.producers.client import Client


def stopped_worker(processes, model: str, **overrides):
    """A worker of `model` that registered, then stopped warmly (it deregistered)."""
    worker = processes.worker("gone", models=(model,), **overrides)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0


def test_a_task_with_a_deadline_is_refused_and_one_without_waits(processes, settings, r):
    stopped_worker(processes, "sim:4")
    table = Table(r)
    with Client(settings=settings) as client:
        with pytest.raises(Overloaded, match="no live executor serves sim:4") as refused:
            client.submit("sim:4", [1], deadline_s=5)
        assert refused.value.wait_s == math.inf
        assert refused.value.deadline_s == pytest.approx(5, abs=0.5)
        with pytest.raises(Overloaded, match="no live executor"):
            client.submit_many("sim:4", [[1], [2]], deadline_s=5)
        assert table.l1_depth("sim:4") == 0  # nothing was enqueued
        # No deadline: it waits for a worker, durably, in L1; `latest` is the version
        # last served, so it waits in the same queue.
        waiting = [client.submit("sim:4", [7]), client.submit("sim:latest", [8])]
        assert [w.route for w in waiting] == ["L1", "L1"]
        assert table.l1_depth("sim:4") == 2
        processes.worker("back", models=("sim:4",), idle=False)
        assert [w.get(timeout=30) for w in waiting] == [[7], [8]]


def test_the_model_slo_is_a_deadline_too(processes, settings):
    stopped_worker(processes, "sim:5", slo_ms=500)
    with Client(settings=settings) as client, pytest.raises(Overloaded, match="no live"):
        client.submit("sim:5", [1])


def test_an_executor_reclaimed_after_a_kill_leaves_none_live(processes, settings, r):
    worker = processes.worker("killed", models=("sim:6",))
    processes.coordinator()
    with Client(settings=settings) as client:
        assert client.submit("sim:6", [1]).get(timeout=10) == [1]  # it has a measured rate
        worker.kill()
        wait_until(lambda: not Table(r).executors("sim:6"), 20, "the coordinator's reclaim")
        with pytest.raises(Overloaded, match="no live executor serves sim:6"):
            client.submit("sim:6", [2], deadline_s=10)


def test_status_shows_the_queue_that_no_executor_serves(processes, settings):
    stopped_worker(processes, "sim:4")
    processes.worker("w1", models=("sim:1",))
    with Client(settings=settings) as client:
        client.submit("sim:4", [1])
    done = tandem("status", "--json", redis_url=settings.redis_url)
    queues = {q["model"]: q for q in json.loads(done.stdout)["queues"]}
    assert queues["sim:4"]["live_executors"] == 0 and queues["sim:4"]["l1"] == 1
    assert queues["sim:1"]["live_executors"] == 1
    shown = tandem("status", redis_url=settings.redis_url)
    assert "no live executor serves sim:4" in shown.stdout.replace("\n", " ")


def test_purge_asks_then_empties_every_priority_and_answers_each_task(processes, settings, r):
    stopped_worker(processes, "sim:4")
    with Client(settings=settings) as client:
        tasks = [client.submit("sim:4", [n], priority=p) for n, p in enumerate([0, 0, 5, 9])]
        declined = tandem("purge", "sim:4", redis_url=settings.redis_url, input="n\n")
        assert declined.returncode == 1 and "Remove the 4 task(s)" in declined.stdout
        assert Table(r).l1_depth("sim:4") == 4  # nothing was removed
        done = tandem("purge", "sim:4", redis_url=settings.redis_url, input="y\n")
        assert done.returncode == 0, done.stderr
        assert "purged 4 task(s) from the first-level queue of sim:4" in done.stdout
        assert Table(r).l1_depth("sim:4") == 0
        for task in tasks:  # each caller learns at once
            with pytest.raises(TaskRevokedError, match="purged from the first-level queue"):
                task.get(timeout=10)
        again = tandem("purge", "sim:4", "--yes", redis_url=settings.redis_url)
        assert "is empty" in again.stdout


def test_purge_refuses_a_name_that_is_not_one_queue(settings):
    for model in ("sim:latest", "nonsense"):
        done = tandem("purge", model, "--yes", redis_url=settings.redis_url)
        assert done.returncode == 1 and "error: BadArgument" in done.stderr, done.stderr


@pytest.mark.parametrize("deadline_s", [0, -1, math.inf, math.nan, "5"])
def test_a_deadline_that_is_not_a_positive_number_is_a_bad_argument(settings, r, deadline_s):
    with Client(settings=settings) as client:
        for submit in (client.submit, client.submit_many):
            inputs = [1] if submit is client.submit else [[1]]
            with pytest.raises(BadArgument, match="deadline_s must be a positive number"):
                submit("sim:1", inputs, deadline_s=deadline_s)


def test_the_command_line_refuses_them_too(settings):
    for value in ("0", "-1"):
        done = tandem("submit", "sim:1", "[1]", "--deadline-s", value, redis_url=settings.redis_url)
        assert done.returncode == 1, done.stdout
        assert "error: BadArgument: deadline_s must be a positive number" in done.stderr
