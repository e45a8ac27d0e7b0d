"""A batch prepared early (the pipeline) is checked against Redis's revocation records
once more just before the batch ahead of it ends, not between the two computes: a task
revoked meanwhile is still never computed. A real executor on a real Redis."""

from __future__ import annotations

import time

import redis
from test_stages import Sleepy, serve

from helpers import wait_until
from tandem.broker import keys
from tandem.broker.state import State
from tandem.workers import compute, prepare


class Recording(Sleepy):
    """Sleepy, which also keeps every item it computed."""

    def __init__(self) -> None:
        super().__init__(stage_s=0.0, compute_s=1.5)  # the revoke comes well before its end
        self.computed: list[int] = []

    def forward(self, batch):
        self.computed.extend(batch)
        return super().forward(batch)


def revoke_one_claimed_early(executor, client, r, arm=lambda: None):
    """A revocation record about (so every batch checks), one task to teach the latency
    model a compute, arm(), then five tasks: the first wakes the IDLE executor and
    computes alone, four more are claimed early and prepared meanwhile, and the third is
    revoked then. Returns the five results and their values."""
    client.revoke("a-task-of-nobody")
    wait_until(lambda: executor.revocations, 10, "the heartbeat to see the record")
    warm = client.submit_many("staged:1", [0])
    assert [x.get(timeout=30) for x in warm] == [0]
    wait_until(lambda: executor.state == State.IDLE, 10, "IDLE again")
    arm()
    results = client.submit_many("staged:1", [1, 2, 3, 4, 5])
    wait_until(lambda: r.llen(keys.inflight(executor.id)) == 5, 10, "the early claim")
    client.revoke(results[2].id)
    return results, [x.get(timeout=30, propagate=False) for x in results]


def test_a_task_revoked_while_the_batch_ahead_computes_is_never_computed(settings, r, monkeypatch):
    # Only the check before the batch ahead ends can see the revoke: none at the start.
    # It comes 0.3 s before that end, so a busy host's late wake-up still finds it ahead.
    monkeypatch.setattr(prepare, "REVOKES_FRESH_S", 60.0)
    monkeypatch.setattr(compute, "RECHECK_LEAD_MS", 300.0)
    model = Recording()
    executor, heartbeat, client = serve(settings, r, model)
    checks: list[float] = []
    revoked = executor.table.revoked

    def timed(task_ids):
        checks.append(time.monotonic())
        return revoked(task_ids)

    executor.table.revoked = timed
    try:
        results, values = revoke_one_claimed_early(executor, client, r)
    finally:
        client.close(), heartbeat.stop(), executor.stop()
    assert results[2].state == "REVOKED" and 3 not in model.computed
    assert values[:2] == [2, 4] and values[3:] == [8, 10]
    # The batch of 2, 4 and 5 was prepared early, while 1 computed: it was checked against
    # Redis then, and before 1 ended, but not between the two computes.
    spans = {key: (started, ended) for key, started, ended in model.spans["compute"]}
    (_, ahead_ended), (following_started, _) = spans[1], spans[2]
    assert not [t for t in checks if ahead_ended < t < following_started]


def test_a_redis_error_in_the_early_revoke_check_loses_no_computed_batch(settings, r, monkeypatch):
    """The check before the batch ahead ends meets a Redis error: that batch is stored
    once, never computed again, and the next one is checked as it starts instead."""
    # 0.3 s before that end, so a busy host's late wake-up still checks while it computes.
    monkeypatch.setattr(compute, "RECHECK_LEAD_MS", 300.0)
    model = Recording()
    executor, heartbeat, client = serve(settings, r, model)
    revoked, during, failed = executor.table.revoked, [], []

    def failing_once(task_ids):
        # While batch 1 computes: the early claim's check, then the one before it ends.
        if executor.computing():
            during.append(task_ids)
            if len(during) == 2 and not failed:
                failed.append(task_ids)
                raise redis.ConnectionError("injected: the connection dropped")
        return revoked(task_ids)

    def arm() -> None:
        executor.table.revoked = failing_once

    try:
        results, values = revoke_one_claimed_early(executor, client, r, arm)
    finally:
        client.close(), heartbeat.stop(), executor.stop()
    assert failed  # the error was met
    assert results[2].state == "REVOKED" and 3 not in model.computed
    assert values[:2] == [2, 4] and values[3:] == [8, 10]
    assert sorted(model.computed) == [0, 1, 2, 4, 5]  # each computed once
