"""Redis under Sentinel: every process takes a sentinel:// URL and the primary's name,
and when the primary is killed and the replica promoted, tasks are served again with no
restart by hand."""

from __future__ import annotations

import time

import pytest

from conftest import Processes
from helpers import fast_settings, wait_until
from tandem.broker.connect import connect, sentinel_parts
from tandem.broker.errors import BadSetting, TandemError
from tandem.broker.settings import load_settings
from tandem.producers.client import Client
from tandem.server import SentinelGroup


@pytest.fixture
def group(tmp_path):
    sentinels = SentinelGroup(tmp_path / "redis", master="tandem").start()
    yield sentinels
    sentinels.stop()


def test_the_url_takes_kombus_form():
    url = "sentinel://:pw@h1:26380/2;sentinel://h2"
    assert sentinel_parts(url) == ([("h1", 26380), ("h2", 26379)], "pw", 2)
    with pytest.raises(BadSetting, match="sentinel_master"):
        load_settings(env={}, redis_url=url)
    with pytest.raises(BadSetting, match="is not sentinel://"):
        sentinel_parts("sentinel://h1;redis://h2")


def test_a_killed_primary_is_replaced_and_tasks_are_served_again(group, tmp_path):
    settings = fast_settings(group.url, sentinel_master="tandem")
    admin = connect(group.url, "tandem")
    processes = Processes(settings, admin, tmp_path / "logs")
    try:
        processes.worker("w1")
        processes.coordinator()
        with Client(settings=settings) as client:
            assert client.submit("sim:1", [1]).get(timeout=10) == [1]
            # Celery's own client reads the result through the same URL and master name.
            task = client.submit("sim:1", [2])
            assert client.app.AsyncResult(task.id).get(timeout=10) == [2]
            old = group.primary()
            killed_at = time.monotonic()
            group.server(old).kill()

            def served() -> bool:
                try:
                    return client.submit("sim:1", [3]).get(timeout=2) == [3]
                except (TandemError, TimeoutError, OSError, Exception):  # noqa: BLE001
                    return False

            wait_until(served, 60, "tasks served again after the failover")
            took = time.monotonic() - killed_at
            assert group.primary() not in (None, old)
            # Served from then on: a burst, every one answered.
            burst = client.submit_many("sim:1", [[n] for n in range(50)])
            assert [r.get(timeout=10) for r in burst] == [[n] for n in range(50)]
        assert processes.started[0].poll() is None  # the worker went on by itself
        print(f"served again {took:.1f} s after the kill")
    finally:
        processes.stop_all()
        admin.close()


def test_with_min_replicas_a_submit_returns_only_once_a_replica_holds_it(group, tmp_path):
    """min_replicas=1: acknowledged while the replica keeps up; NotReplicated (a
    BrokerUnavailable) while it is stopped, never a claim of success; again after."""
    import os
    import signal

    from tandem.broker.errors import BrokerUnavailable, NotReplicated

    settings = fast_settings(group.url, sentinel_master="tandem", min_replicas=1)
    admin = connect(group.url, "tandem")
    processes = Processes(settings, admin, tmp_path / "logs")
    (replica,) = [s for s in group.servers if s.port != group.primary()]
    try:
        processes.worker("w1")
        with Client(settings=settings) as client:
            assert client.submit("sim:1", [1]).get(timeout=10) == [1]
            os.kill(replica.process.pid, signal.SIGSTOP)
            try:
                with pytest.raises(NotReplicated, match="0 of 1 replica"):
                    client.submit("sim:1", [2])
                assert issubclass(NotReplicated, BrokerUnavailable)
            finally:
                os.kill(replica.process.pid, signal.SIGCONT)
            wait_until(lambda: _acknowledged(client), 10, "the replica to catch up")
    finally:
        processes.stop_all()
        admin.close()


def _acknowledged(client) -> bool:
    from tandem.broker.errors import NotReplicated

    try:
        return client.submit("sim:1", [3]).get(timeout=5) == [3]
    except NotReplicated:
        return False


def test_without_a_replica_min_replicas_refuses_every_submit(processes, settings):
    from tandem.broker.errors import NotReplicated

    processes.worker("w1")
    with (
        Client(settings=settings.replace(min_replicas=1)) as client,
        pytest.raises(NotReplicated, match="0 of 1 replica"),
    ):
        client.submit("sim:1", [1])


def test_the_sentinel_fault_run_loses_no_acknowledged_task_with_min_replicas():
    """tandem soak --faults sentinel, one round: the primary killed under steady load and
    brought back as a replica; with min_replicas=1 every accepted task completes."""
    from tandem.tools.failover import run_failover

    report = run_failover(load_settings(env={}), rounds=1, rate=50.0, min_replicas=1)
    assert report.rounds == 1 and report.accepted > 0
    assert report.lost == 0 and report.completed + report.failed == report.accepted
    assert report.served_again_s[0] != float("inf")  # served again, with no restart by hand
