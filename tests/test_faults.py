"""Faults injected into real processes under load: nothing may be lost."""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest
import redis
from kombu import pools

from helpers import executors_of, plain_celery, wait_until
from tandem.broker import keys
from tandem.broker.errors import BrokerUnavailable, QueueFull
from tandem.broker.table import Table
from tandem.producers.client import Client
from tandem.server import RedisServer


class Load(threading.Thread):
    """Submits sim tasks at a steady pace until stopped; keeps every submit that returned."""

    def __init__(self, client: Client, per_second: float = 80.0) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.interval_s = 1 / per_second
        self.accepted: dict[str, int] = {}
        self.refused = 0
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.wait(self.interval_s):  # pacing the load, not synchronising
            try:
                result = self.client.submit("sim:1", [n])
                self.accepted[result.id] = n
            except BrokerUnavailable:
                self.refused += 1
            n += 1

    def finish(self) -> dict[str, int]:
        self.stop.set()
        self.join()
        return self.accepted


def all_done(r: redis.Redis, accepted: dict[str, int], timeout_s: float = 60.0) -> None:
    """Every accepted task has its own correct SUCCESS result."""
    ids = list(accepted)
    result_keys = [keys.result(t) for t in ids]
    wait_until(
        lambda: r.exists(*result_keys) == len(ids),
        timeout_s,
        f"{len(ids)} results ({r.exists(*result_keys)} there)",
    )
    for task_id, raw in zip(ids, r.mget(result_keys), strict=True):
        meta = json.loads(raw)
        assert (meta["status"], meta["result"]) == ("SUCCESS", [accepted[task_id]]), task_id


def test_repeated_worker_kills_lose_nothing(processes, settings, r):
    processes.coordinator()
    processes.worker("w0", sim_base_ms=150.0)
    gone = r.pubsub(ignore_subscribe_messages=True)
    gone.subscribe(keys.STATE_CHANNEL)
    with Client(settings=settings) as client:
        load = Load(client)
        load.start()
        recoveries = []
        for round_ in range(3):
            victim_name = f"k{round_}"
            victim = processes.worker(victim_name, sim_base_ms=150.0)
            executor = wait_until(
                lambda name=victim_name: [
                    e for e in executors_of(r, name) if e.state == "WORKING" and e.inflight_depth
                ],
                30,
                f"{victim_name} mid-batch",
            )[0]
            victim.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()
            wait_until(lambda e=executor: _gone_seen(gone, e.id), 30, "the reclaim")
            recoveries.append(time.monotonic() - killed_at)
        accepted = load.finish()
        all_done(r, accepted)
    print(f"recovery from kill to reclaim: {[round(t, 2) for t in recoveries]} s")
    assert len(accepted) > 100
    assert int(r.hget(keys.STATS, "redelivered") or 0) >= 3


def _gone_seen(pubsub, executor_id: str) -> bool:
    message = pubsub.get_message(timeout=0.1)
    while message is not None:
        change = json.loads(message["data"])
        if change["executor"] == executor_id and change["state"] == "GONE":
            return True
        message = pubsub.get_message(timeout=0.01)
    return False


@pytest.fixture
def durable_redis(tmp_path):
    server = RedisServer(tmp_path / "durable", appendfsync="always").start()
    yield server
    gc.collect()  # results unsubscribe when collected, while this Redis still answers
    server.stop()


def test_redis_killed_and_restarted_loses_no_accepted_task(durable_redis, processes, settings):
    settings = settings.replace(redis_url=durable_redis.url)
    processes.settings = settings
    processes.client = redis.Redis.from_url(durable_redis.url)
    coordinator = processes.coordinator()
    workers = [processes.worker("w1"), processes.worker("w2")]
    with Client(settings=settings) as client:
        load = Load(client)
        load.start()
        wait_until(lambda: len(load.accepted) > 50, 30, "load before the crash")
        durable_redis.kill()
        # Down longer than the heartbeat TTL, so executors also expire and get reclaimed.
        wait_until(lambda: load.refused > 150, 30, "2 s of submits refused while Redis is down")
        durable_redis.start()
        accepted_before = len(load.accepted)
        wait_until(lambda: len(load.accepted) > accepted_before + 50, 60, "load after restart")
        accepted = load.finish()
        r = redis.Redis.from_url(durable_redis.url)
        all_done(r, accepted, timeout_s=90)
        assert all(p.poll() is None for p in [coordinator, *workers])
        assert client.submit("sim:1", ["after"]).get(timeout=30) == ["after"]
    assert "Traceback" not in processes.log("coordinator")


def test_tasks_flow_without_the_coordinator_and_it_catches_up(processes, settings, r):
    coordinator = processes.coordinator()
    processes.worker("w1", sim_base_ms=300.0)
    victim = processes.worker("w2", sim_base_ms=300.0)
    coordinator.send_signal(signal.SIGTERM)
    assert coordinator.wait(10) == 0
    with Client(settings=settings) as client:
        assert client.submit("sim:1", [1]).get(timeout=10) == [1]
        results = client.submit_many("sim:1", [[n] for n in range(40)])
        executor = wait_until(
            lambda: [e for e in executors_of(r, "w2") if e.inflight_depth], 30, "w2 mid-batch"
        )[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        assert r.exists(keys.executor(executor.id))  # nobody reclaims it yet
        processes.coordinator()
        assert [res.get(timeout=60) for res in results] == [[n] for n in range(40)]
    assert not r.exists(keys.executor(executor.id))


def test_a_worker_carries_on_after_its_connections_are_cut(processes, settings, r):
    processes.worker("w1")
    with Client(settings=settings) as client:
        assert client.submit("sim:1", [0]).get(timeout=10) == [0]
        killed = r.client_kill_filter(_type="normal", skipme=True)
        killed += r.client_kill_filter(_type="pubsub", skipme=True)
        assert killed >= 2
    # Celery's broker connections are pooled per URL for the whole test process (kombu's
    # global pools); the cut closed the idle ones too, so later tests must not inherit them.
    pools.reset()
    with Client(settings=settings) as client:
        results = client.submit_many("sim:1", [[n] for n in range(50)])
        assert [res.get(timeout=30) for res in results] == [[n] for n in range(50)]
    assert processes.started[0].poll() is None


def test_a_redelivered_task_keeps_one_result(processes, settings, r):
    processes.coordinator()
    paused = processes.worker("w1", sim_base_ms=3000.0)
    processes.worker("w2", sim_base_ms=50.0)
    with Client(settings=settings) as client:
        results = client.submit_many("sim:1", [[n] for n in range(2)])
        stale = wait_until(
            lambda: [e for e in executors_of(r, "w1") if e.inflight_depth], 10, "w1 holding a task"
        )[0]
        paused.send_signal(signal.SIGSTOP)  # alive but silent, like a partitioned worker
        try:
            assert [res.get(timeout=30) for res in results] == [[0], [1]]
            first = {res.id: r.get(keys.result(res.id)) for res in results}
        finally:
            paused.send_signal(signal.SIGCONT)
        wait_until(
            lambda: int(r.hget(keys.STATS, "duplicates") or 0) >= 1,
            30,
            "the stale worker finishing its copy",
        )
        assert {res.id: r.get(keys.result(res.id)) for res in results} == first
        assert int(r.hget(keys.STATS, "redelivered")) >= 1
        # The stale executor found itself reclaimed and registered again.
        wait_until(lambda: r.hget(keys.executor(stale.id), "state") == b"IDLE", 30, "w1 back")
        assert client.submit("sim:1", ["again"]).get(timeout=30) == ["again"]


def test_a_bounded_queue_refuses_with_queue_full(processes, settings, r):
    # No pipeline: it would move what waits in L1 into in-flight while the first computes,
    # whenever its first compute starts, and this test counts L1.
    processes.worker("w1", sim_base_ms=2000.0, max_queue=5, pipeline=False)
    with Client(settings=settings) as client:
        first = client.submit("sim:1", [0])  # makes the executor WORKING
        accepted = [client.submit("sim:1", [n]) for n in range(1, 6)]
        with pytest.raises(QueueFull, match="sim:1 has 5 tasks waiting"):
            client.submit("sim:1", [6])
        assert Table(r).l1_depth("sim:1") == 5
        # A plain Celery publisher pushes to the list directly: the bound does not stop it.
        plain = plain_celery(settings).send_task(
            "tandem.infer", kwargs={"model": "sim:1", "inputs": ["plain"]}, queue="tandem.l1.sim.1"
        )
        assert Table(r).l1_depth("sim:1") == 6
        assert [res.get(timeout=30) for res in [first, *accepted]] == [[n] for n in range(6)]
        assert plain.get(timeout=30) == ["plain"]


def test_a_short_soak_loses_nothing(tmp_path):
    done = subprocess.run(
        ["tandem", "soak", "--minutes", "0.3", "--kill-every-s", "4"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = dict(
        line.rsplit(None, 1)
        for line in done.stdout.splitlines()
        if not line.startswith(("failed", "max recovery", "poison", "workers that"))
    )
    assert lines["lost"] == "0"
    # The poison tasks it sent (one that kills, one that hangs) were all quarantined. (A
    # task whose workers the soak killed under it 3 times is too; it counts apart.)
    (poison,) = [x for x in done.stdout.splitlines() if x.startswith("poison tasks sent")]
    sent, quarantined = re.findall(r"\d+", poison)
    assert int(sent) >= 2 and quarantined == sent, poison
    assert "PoisonMessage" in done.stdout
    assert int(lines["submitted (accepted)"]) > 500
    assert lines["Redis restarts"] == "1"
    assert int(lines["worker kills survived"]) >= 1


def test_a_burst_cut_short_by_redis_names_what_it_enqueued(tmp_path, settings):
    """Redis fills up (maxmemory, noeviction) part way through a burst, which is routed
    256 tasks per script call: the BrokerUnavailable carries the tasks enqueued before it,
    whole calls of them, and exactly those are in L1."""
    server = RedisServer(tmp_path / "redis").start()
    r = redis.Redis.from_url(server.url)
    try:
        table = Table(r)
        table.register(
            "busy", "sim:1", worker="w", max_batch=4, ttl_ms=60_000, max_wait_ms=0, pid=1
        )
        with Client(settings=settings.replace(redis_url=server.url)) as client:
            first = client.submit("sim:1", [-1])  # the scripts are loaded, the client connected
            r.config_set("maxmemory-policy", "noeviction")
            r.config_set("maxmemory", r.info("memory")["used_memory"] + 1024 * 1024)
            with pytest.raises(BrokerUnavailable, match="OOM") as refused:
                client.submit_many("sim:1", [[n] for n in range(3000)])
            accepted = refused.value.accepted
        assert 0 < len(accepted) < 3000 and len(accepted) % 256 == 0
        queued = [json.loads(m)["headers"]["id"] for m in r.lrange(keys.l1("sim:1"), 0, -1)]
        assert set(queued) == {first.id} | {res.id for res in accepted}
        assert len(queued) == len(accepted) + 1
    finally:
        r.config_set("maxmemory", 0)
        r.close()
        server.stop()
