"""tandem.infer under the Celery features users reach for: revoke, inspect, control."""

from __future__ import annotations

import pytest

from helpers import plain_celery, wait_until
from tandem.broker import keys
from tandem.producers.client import Client

SIM = keys.l1("sim:1")


def infer(app, inputs, **options):
    return app.send_task("tandem.infer", kwargs={"model": "sim:1", "inputs": inputs}, **options)


@pytest.fixture
def plain(settings):
    return plain_celery(settings)


def inspect(plain, what: str, *args):
    replies = getattr(plain.control.inspect(destination=["w1@test"], timeout=2), what)(*args)
    return (replies or {}).get("w1@test")


def test_revoke_inspect_and_control(processes, r, settings, plain):
    # Revoked before any worker runs: only the record in Redis can stop it.
    early = infer(plain, ["early"], queue=SIM)
    kept = infer(plain, ["kept"], queue=SIM)
    client = Client(settings=settings)
    client.revoke(early.id)
    assert early.state == "REVOKED"
    # A 4 s batch window, then 2.5 s per batch: time to look at each stage.
    processes.worker("w1", max_wait_ms=4000, sim_base_ms=2500, max_batch=4)
    assert kept.get(timeout=30) == ["kept"]

    # WAITING: a task routed to an L2 opens the window and is reserved; then active.
    first = client.submit("sim:1", ["first"])
    assert first.route == "L2"
    reserved = wait_until(lambda: inspect(plain, "reserved"), 10, "a reserved task")
    assert [t["id"] for t in reserved] == [first.id]
    assert reserved[0]["kwargs"] == {"model": "sim:1", "inputs": ["first"]}
    assert reserved[0]["hostname"] == "w1@test" and reserved[0]["name"] == "tandem.infer"
    assert inspect(plain, "query_task", first.id)[first.id][0] == "reserved"
    active = wait_until(lambda: inspect(plain, "active"), 10, "an active task")
    assert [t["id"] for t in active] == [first.id] and active[0]["time_start"]

    # Computing: new tasks wait in L1. Revoke one of them, and the computing one too.
    waiting = [infer(plain, [n], queue=SIM) for n in range(3)]
    replies = plain.control.revoke([waiting[1].id, first.id], reply=True, timeout=2)
    assert replies and "w1@test" in replies[0]
    assert [res.get(timeout=30) for res in (waiting[0], waiting[2])] == [[0], [2]]
    assert waiting[1].state == first.state == early.state == "REVOKED"
    # The hooks log a batch just after its results are stored.
    skipped = [f"task={task.id}" for task in (early, waiting[1])]  # never computed

    def logged() -> str | None:
        text = processes.log("w1")
        return text if all(line in text for line in skipped) else None

    log = wait_until(logged, 10, "each skipped task logged")
    assert "task_revoked executor=w1@test/sim:1" in log

    # Celery control that a pool has and an executor has not: a clear refusal.
    for reply in plain.control.pool_grow(1, reply=True, destination=["w1@test"]):
        assert "not applicable to tandem executors" in reply["w1@test"]["error"]
    terminated = plain.control.revoke(waiting[0].id, terminate=True, reply=True, timeout=2)
    assert "not applicable" in terminated[0]["w1@test"]["ok"]
    client.close()
    stamped = plain.control.revoke_by_stamped_headers({"x": "1"}, reply=True, timeout=2)
    assert "not supported" in stamped[0]["w1@test"]["ok"]
