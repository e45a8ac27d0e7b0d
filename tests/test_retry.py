"""The one retry policy (tandem.broker.retry), against a real Redis: errors that are not
disconnects are retried like disconnects, anything else is not, and a stop ends it."""

from __future__ import annotations

import threading

import pytest
import redis

from tandem.broker.retry import Backoff, retry
from tandem.server import free_port


def test_the_backoff_doubles_to_its_cap_and_resets():
    backoff = Backoff(first_s=0.1, cap_s=0.5)
    assert [backoff.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    backoff.reset()
    assert backoff.next() == 0.1


@pytest.fixture
def full(r):
    """Redis at its maxmemory: writes fail with OOM until the limit is lifted."""
    r.set("ballast", "x" * 200_000)
    r.config_set("maxmemory", 1)
    yield r
    r.config_set("maxmemory", 0)
    r.delete("ballast")


def test_an_oom_is_retried_until_redis_takes_the_write(r, full, caplog):
    tries = []

    def step() -> int:
        tries.append(1)
        if len(tries) == 3:
            full.config_set("maxmemory", 0)  # the operator frees memory
        return r.rpush("retried", "task")

    assert retry(step, what="test", backoff=Backoff(0.001, 0.001)) == 1
    assert len(tries) == 3 and r.lrange("retried", 0, -1) == [b"task"]
    assert caplog.text.count("Redis error OutOfMemoryError") == 2


def test_a_refused_connection_is_retried(r):
    """The first tries meet a port with no Redis behind it; then Redis is there."""
    gone = redis.Redis(port=free_port(), socket_connect_timeout=1)
    clients = [gone, gone, r]

    def step() -> bytes:
        return clients.pop(0).echo("back")

    assert retry(step, what="test", backoff=Backoff(0.001, 0.001)) == b"back"
    assert not clients


def test_a_bug_is_not_retried(r):
    tries = []

    def step() -> None:
        tries.append(1)
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        retry(step, what="test")
    assert len(tries) == 1


def test_a_set_stop_ends_the_tries(r, full):
    stop = threading.Event()
    tries = []

    def step() -> None:
        tries.append(1)
        if len(tries) == 2:
            stop.set()
        r.rpush("never", "x")

    assert retry(step, what="test", stop=stop, backoff=Backoff(0.001, 0.001)) is None
    assert len(tries) == 2 and not r.exists("never")


def test_a_step_that_raises_refusals_still_retries_disconnects(r, full):
    """The returner's policy: a disconnect is retried, an OOM reply is raised at once."""
    gone = redis.Redis(port=free_port(), socket_connect_timeout=1)
    clients = [gone, r]

    def step() -> int:
        return clients.pop(0).rpush("refused", "x")

    with pytest.raises(redis.exceptions.OutOfMemoryError):
        retry(step, what="test", backoff=Backoff(0.001, 0.001), raise_refusals=True)
    assert not clients and not r.exists("refused")
