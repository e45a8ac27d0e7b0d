"""Self-healing with real workers: poison tasks are quarantined, executors restart in place,
hung computes and executors that keep crashing make their worker exit non-zero."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import redis
from test_operations import _scrapes, scrape, value

from helpers import executors_of, wait_until
from tandem.broker import deadletter, keys
from tandem.broker.faults import ENV as FAULTS
from tandem.broker.table import Table
from tandem.producers.client import Client
from tandem.server import RedisServer, free_port
from tandem.stack import spawn, stop_process
from tandem.tools import chaos
from tandem.workers.bootstep import EXIT_UNHEALTHY


@pytest.fixture
def saboteur_repo(tmp_path) -> Path:
    """A repository with saboteur:1 (tools/chaos.py)."""
    return chaos.write_repository(tmp_path / "repo")


def results_of(r: redis.Redis, ids: list[str]) -> dict[str, dict]:
    found = r.mget([keys.result(i) for i in ids])
    return {i: json.loads(raw) for i, raw in zip(ids, found, strict=True) if raw}


def test_poison_tasks_are_quarantined_and_every_other_task_completes(
    processes, settings, r, saboteur_repo
):
    """One task kills its worker, one hangs it (compute_timeout_s); a supervisor restarts
    workers. Each is dead-lettered after max_deliveries; the 30 good tasks all succeed."""
    port = free_port()
    processes.coordinator(metrics_port=port)
    worker = {"models": ("saboteur:1",), "repository": str(saboteur_repo)}
    worker["compute_timeout_s"] = 1.0
    started = [processes.worker(f"w{n}", **worker) for n in range(2)]
    with Client(settings=settings) as client:
        # Good inputs never hold chaos.KILL or chaos.HANG.
        good = {client.submit("saboteur:1", [n + 0.5, 0, 0, 0]).id: n for n in range(15)}
        killer = client.submit("saboteur:1", [chaos.KILL, 0, 0, 0]).id
        hanger = client.submit("saboteur:1", [chaos.HANG, 0, 0, 0]).id
        good |= {client.submit("saboteur:1", [n + 0.5, 1, 1, 1]).id: n for n in range(15, 30)}
    ids = [*good, killer, hanger]
    exits = []

    def supervised() -> bool:
        """Restart each worker that exited, as compose or Kubernetes would."""
        for n, process in enumerate(started):
            if process.poll() is not None:
                exits.append(process.returncode)
                started[n] = processes.worker(f"w{n}r{len(exits)}", idle=False, **worker)
        return len(results_of(r, ids)) == len(ids)

    wait_until(supervised, 240, "every task's result, restarting workers that exit")
    done = results_of(r, ids)
    for task_id, n in good.items():
        assert done[task_id]["status"] == "SUCCESS", done[task_id]
        assert done[task_id]["result"] == [n + 0.5, *([0.0] * 3 if n < 15 else [1.0] * 3)]
    for task_id in (killer, hanger):
        assert done[task_id]["status"] == "FAILURE"
        assert done[task_id]["result"]["exc_type"] == "PoisonMessage"
    letters = {x.id: x for x in deadletter.read(r)}
    assert set(letters) == {killer, hanger}
    for letter in letters.values():
        assert len(letter.executors) == settings.max_deliveries
        assert all("/saboteur:1/" in e for e in letter.executors)
    # Killed by the model (KILL), or exited on the hung compute (70); never anything else.
    # (When both were in one batch, the kill counted a delivery for the hung one too.)
    assert set(exits) == {chaos.KILL, EXIT_UNHEALTHY}, exits
    assert len(exits) <= 2 * settings.max_deliveries, exits
    assert r.llen(keys.retry("saboteur:1")) == r.llen(keys.POISON) == 0

    # An operator sees them on the dashboards, and with `tandem dead`.
    samples = wait_until(lambda: _scrapes(port) and scrape(port), 10, "a scrape")
    assert value(samples, "tandem_poisoned_total") == 2
    assert value(samples, "tandem_dead_letters") == 2
    assert value(samples, "tandem_redelivered_total") >= 2 * settings.max_deliveries - 1
    assert value(samples, "tandem_retry_depth", model="saboteur:1") == 0
    # 2 workers started, then each one the poison took down started again: flapping.
    assert value(samples, "tandem_registrations_total") >= 2 + len(exits)
    out = dead_cli(settings)
    assert "2 dead letters" in out and killer in out and hanger in out
    assert "PoisonMessage: quarantined after 3 deliveries" in out


def dead_cli(settings, *args: str) -> str:
    from helpers import tandem

    return tandem("dead", *args, redis_url=settings.redis_url).stdout


def test_dead_letters_can_be_listed_requeued_and_purged(processes, settings, r):
    from tandem.broker import message

    processes.worker("w1")
    task_id, envelope = message.encode("sim:1", [5], queue=keys.l1("sim:1"))
    record = deadletter.record(envelope.encode(), "PoisonMessage: test", task_id=task_id)
    r.lpush(keys.DEAD, record.replace('"model": null', '"model": "sim:1"'))
    r.lpush(keys.DEAD, deadletter.record(b"\xff junk", "BadInput: junk", model="sim:1"))
    r.lpush(keys.DEAD, b"not a record")
    listed = json.loads(dead_cli(settings, "--json"))
    assert listed["count"] == 3
    reasons = [x["reason"] for x in listed["letters"]]
    assert reasons[0].startswith("unreadable dead-letter record")
    assert reasons[1:] == ["BadInput: junk", "PoisonMessage: test"]
    # Only a message a worker can serve is requeueable: junk without an id would be
    # dead-lettered again at once.
    assert [x["requeueable"] for x in listed["letters"]] == [False, False, True]
    assert "(not requeueable: its message carries no usable task id" in dead_cli(settings)
    from helpers import tandem

    requeued = tandem("dead", "--requeue", redis_url=settings.redis_url)
    assert requeued.returncode == 1  # two letters could not be requeued, and say why
    assert f"requeued {task_id} to" in requeued.stdout
    kept = requeued.stderr.splitlines()
    assert "kept (no id): its message was not kept whole" in kept[0]
    assert "kept (no id): its message carries no usable task id" in kept[1]
    with Client(settings=settings) as client:
        assert client.app.AsyncResult(task_id).get(timeout=30) == [5]
    assert deadletter.count(r) == 2  # the two kept; nothing was dead-lettered again
    assert "purged" in dead_cli(settings, "--purge")
    assert deadletter.count(r) == 0


def test_an_executor_that_crashes_restarts_in_place_and_loses_nothing(processes, settings, r):
    """A bug right after a claim (the tasks are in in-flight): the executor hands them back
    through reclaim, registers again and serves them."""
    # A burst: one task to its L2, 19 to L1 in the same step. Its first claim (the
    # pipeline's, while that one computes) takes the next batch from L1 into in-flight,
    # and the bug strikes; the computed task is stored first.
    os.environ[FAULTS] = "claim:after:1:crash"  # read by the worker process it starts
    try:
        processes.worker("w2", sim_base_ms=50.0)
    finally:
        del os.environ[FAULTS]
    (executor,) = executors_of(r, "w2")
    with Client(settings=settings) as client:
        submitted = client.submit_many("sim:1", [[n] for n in range(20)])
        assert [x.get(timeout=60) for x in submitted] == [[n] for n in range(20)]
    log = processes.log("w2")
    assert "failed (RuntimeError: injected fault at claim:after:1); restart 1" in log
    assert [e.id for e in executors_of(r, "w2")] == [executor.id]  # registered again
    assert r.llen(keys.inflight(executor.id)) == 0
    assert int(r.hget(keys.STATS, "redelivered") or 0) >= 1
    assert int(r.hget(keys.STATS, "registrations")) >= 2  # its start, and its restart


def test_an_executor_that_keeps_crashing_makes_its_worker_exit_non_zero(
    processes, settings, r, monkeypatch
):
    monkeypatch.setenv(FAULTS, "claim_or_idle:before:*:crash")
    worker = processes.worker("w1", idle=False, max_restarts=2)
    with Client(settings=settings) as client:
        waiting = [client.submit("sim:1", [n]).id for n in range(5)]
        assert worker.wait(60) == EXIT_UNHEALTHY
    assert "crashed 3 times in a row" in processes.log("w1")
    # Nothing is lost: each task was served before the faults began, or waits for a
    # healthy worker.
    queued = Table(r).l1_depth("sim:1") + r.llen(keys.retry("sim:1"))
    assert queued >= 1
    assert len(results_of(r, waiting)) + queued == len(waiting)


def test_claim_path_faults_strand_nothing(processes, settings, r, monkeypatch):
    """A Redis failure after each step of the claim path did its work (a lost reply)."""
    steps = ["wait_l2", "window", "state", "begin", "claim", "claim_or_idle", "complete", "count"]
    monkeypatch.setenv(FAULTS, ",".join(f"{s}:after:2" for s in steps))
    processes.worker("w1", max_wait_ms=20.0, sim_base_ms=30.0)
    sent: dict[str, int] = {}
    with Client(settings=settings) as client:

        def wave() -> list[str]:
            """Three tasks at once, each served: windows, claims and idling each time."""
            for n in range(len(sent), len(sent) + 3):
                sent[client.submit("sim:1", [n]).id] = n
            for task_id, n in list(sent.items())[-3:]:
                assert client.app.AsyncResult(task_id).get(timeout=60) == [n]
            log = processes.log("w1")
            return [s for s in steps if f"injected fault at {s}:after:2" not in log]

        while missing := wave():
            assert len(sent) < 300, f"no fault at {missing}"
    (executor,) = executors_of(r, "w1")
    assert r.llen(keys.inflight(executor.id)) == 0
    assert r.llen(keys.l2(executor.id)) == 0
    assert Table(r).l1_depth("sim:1") == r.llen(keys.retry("sim:1")) == 0


def test_the_returner_meets_oom_and_nothing_is_lost(tmp_path, settings):
    """Results cannot be stored (maxmemory, noeviction): the executor restarts or, when
    Celery's own consumer gives up on OOM first, the worker exits non-zero. Never a stall."""
    server = RedisServer(tmp_path / "redis").start()
    r = redis.Redis.from_url(server.url)
    r.config_set("maxmemory-policy", "noeviction")
    small = settings.replace(redis_url=server.url, sim_base_ms=1500.0)
    log = tmp_path / "w1.log"
    worker = spawn(["worker"], small.replace(hostname="w1@oom"), log)
    try:
        wait_until(lambda: Table(r).executors(), 60, "the worker")
        with Client(settings=small) as client:
            ids = {client.submit("sim:1", [n]).id: n for n in range(4)}
        # Computing (begun, WORKING): its store, or the claim of the next batch made while
        # it computes, is the executor's next write. OOM on the claim (or on a task merely
        # taken from L2, before the window's writes) sends the executor into registering
        # again instead.
        wait_until(
            lambda: any(e.state == "WORKING" and e.inflight_depth for e in Table(r).executors()),
            30,
            "a batch computing",
        )
        r.config_set("maxmemory", "1")  # every write now fails with OOM

        def failed() -> bool:
            """The store failed; or the executor restarted, when the claim of the next
            batch (made while this one computes) met OOM first; or Celery's consumer
            exited the worker first."""
            text = log.read_text()
            restarted = "handing its tasks back and registering again" in text
            return "storing results failed" in text or restarted or worker.poll() is not None

        try:
            wait_until(failed, 30, "the returner to fail, the executor to restart, or an exit")
        except AssertionError as e:  # a stall: show where the worker was
            tail = "\n".join(log.read_text().splitlines()[-30:])
            raise AssertionError(f"{e}; the worker's log ends:\n{tail}") from None
        assert "OOM command not allowed" in log.read_text()
        r.config_set("maxmemory", "0")
        exits = []

        def supervised() -> bool:
            nonlocal worker
            if worker.poll() is not None:  # exited: its supervisor starts it again
                exits.append(worker.returncode)
                name = f"w{len(exits) + 1}@oom"
                worker = spawn(["worker"], small.replace(hostname=name), tmp_path / f"{name}.log")
            return len(results_of(r, list(ids))) == len(ids)

        wait_until(supervised, 90, "every result")
        assert 0 not in exits
        assert {i: m["result"] for i, m in results_of(r, list(ids)).items()} == {
            i: [n] for i, n in ids.items()
        }
    finally:
        stop_process(worker)
        r.close()
        server.stop()
