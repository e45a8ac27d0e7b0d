"""Redis errors that are not disconnects: an executor rebuilds from Redis and keeps serving."""

from __future__ import annotations

import signal

import pytest
import redis

from helpers import executors_of, wait_until
from tandem.broker import keys
from tandem.broker.errors import BadArgument, BrokerUnavailable, TandemError
from tandem.producers.client import Client
from tandem.server import free_port


@pytest.fixture
def readonly(r):
    """Make the test Redis a read-only replica of a master that is not there (a failover
    seen from the old primary), then writable again; its data stays."""

    def on() -> None:
        r.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))

    yield on
    r.execute_command("REPLICAOF", "NO", "ONE")


def test_after_readonly_the_worker_serves_again_or_exits_non_zero(processes, r, settings, readonly):
    """Celery's own consumer treats READONLY as unrecoverable and stops the worker (warm:
    its executor hands its tasks back); a supervisor restarts it. Either way nothing is lost."""
    processes.coordinator()
    worker = processes.worker("w1")
    with Client(settings=settings) as client:
        waiting = client.submit("sim:1", [-1])
        assert waiting.get(timeout=30) == [-1]
        readonly()
        with pytest.raises(BrokerUnavailable, match="READONLY"):
            client.submit("sim:1", [1])
        met = ("ReadOnlyError", "READONLY", "UNBLOCKED")
        wait_until(lambda: any(m in processes.log("w1") for m in met), 30, "the worker to meet it")
        r.execute_command("REPLICAOF", "NO", "ONE")

        processes.worker("w2")  # a second worker, or w1 restarted by its supervisor
        results = [client.submit("sim:1", [n]) for n in range(20)]
        assert [x.get(timeout=30) for x in results] == [[n] for n in range(20)]
    assert worker.poll() in (None, *range(1, 256))  # still serving, or exited non-zero
    assert "crashed" not in processes.log("w1")
    assert "Traceback" not in processes.log("coordinator")


def test_a_graceful_stop_marks_the_executor_stopping_first(processes, r):
    worker = processes.worker("w1")
    (executor,) = executors_of(r, "w1")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(60) == 0
    states = [
        fields[b"state"]
        for _, fields in r.xrange(keys.STATE_STREAM)
        if fields[b"executor"] == executor.id.encode()
    ]
    assert states[-2:] == [b"STOPPING", b"GONE"]


def test_readonly_is_named_in_the_clients_error(r, settings, readonly):
    r.sadd(keys.MODELS, "sim:1")
    readonly()
    with Client(settings=settings) as client, pytest.raises(BrokerUnavailable) as caught:
        client.submit("sim:1", [1])
    assert "Redis refused the command: READONLY" in str(caught.value)
    assert isinstance(caught.value.__cause__, redis.ResponseError)


def test_a_script_flush_is_survived_by_every_client(processes, r, settings):
    """NOSCRIPT after SCRIPT FLUSH (or a Redis restarted without its script cache): each
    client loads the script again on its next call and goes on."""
    processes.coordinator()
    processes.worker("w1")
    with Client(settings=settings) as client:
        assert client.submit("sim:1", [1]).get(timeout=30) == [1]
        r.script_flush()
        assert [client.submit("sim:1", [n]).get(timeout=30) for n in range(5)] == [
            [n] for n in range(5)
        ]
    log = processes.log("w1")
    assert "NoScriptError" not in log and "Traceback" not in log


def test_a_redis_that_does_not_answer_in_time_is_broker_unavailable_from_every_method(
    processes, r, settings
):
    """redis-py's TimeoutError never reaches the caller: submit, submit_many, revoke and
    resolving NAME:latest all raise BrokerUnavailable. CLIENT PAUSE holds the real Redis."""
    processes.worker("w1")
    slow = settings.replace(redis_url=settings.redis_url + "?socket_timeout=0.3")
    with Client(settings=slow) as client:
        done = client.submit("sim:1", [1])
        assert done.get(timeout=10) == [1]
        calls = {
            "submit": lambda: client.submit("sim:1", [2]),
            "submit_many": lambda: client.submit_many("sim:1", [[3], [4]]),
            "revoke": lambda: client.revoke(done.id),
            "resolve": lambda: client.resolve("tiny:latest"),
        }
        for name, call in calls.items():
            r.execute_command("CLIENT", "PAUSE", "3000", "ALL")
            try:
                with pytest.raises(BrokerUnavailable, match="Timeout"):
                    call()
            except pytest.fail.Exception as e:
                raise AssertionError(f"{name}: {e}") from None
            finally:
                r.execute_command("CLIENT", "UNPAUSE")


def test_a_bad_argument_is_a_tandem_error_and_still_a_value_error(processes, settings):
    processes.worker("w1")
    with Client(settings=settings) as client:
        for call in (
            lambda: client.submit("sim:1", [1], priority=10),
            lambda: client.submit("no-version", [1]),
        ):
            with pytest.raises(BadArgument) as info:
                call()
            assert isinstance(info.value, TandemError) and isinstance(info.value, ValueError)


def test_a_result_key_of_another_type_dead_letters_its_task_alone(processes, r, settings):
    """One task's result key holds a list: that task is dead-lettered with Redis's reason,
    its batch-mates are stored, and the executor does not restart."""
    from tandem.broker import deadletter

    processes.worker("w1", max_wait_ms=300.0)  # a window, so the three share a batch
    bad = "0bad0000-0000-4000-8000-000000000000"
    r.rpush(keys.result(bad), "not a result")
    with Client(settings=settings) as client:
        first = client.submit("sim:1", [1])
        client.submit("sim:1", [2], task_id=bad)
        last = client.submit("sim:1", [3])
        assert first.get(timeout=10) == [1] and last.get(timeout=10) == [3]
    wait_until(lambda: deadletter.count(r) == 1, 10, "the refused task's dead letter")
    (letter,) = deadletter.read(r)
    assert letter.id == bad and letter.model == "sim:1"
    assert letter.reason.startswith(f"ResultRefused: {keys.result(bad)}: WRONGTYPE")
    assert letter.blocked is None  # its message is whole: it can be requeued once fixed
    assert r.lrange(keys.result(bad), 0, -1) == [b"not a result"]  # left as it was
    assert not any(e.inflight_depth for e in executors_of(r, "w1@test"))
    assert "storing results failed" not in processes.log("w1")


def test_the_scripts_prefixes_are_the_keys_of_keys_py():
    from tandem.broker import scripts

    lua = scripts.source("complete")
    assert f"'{keys.RESULT_PREFIX}'" in lua and f"'{keys.metrics('')}'" in lua
