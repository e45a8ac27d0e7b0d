"""One Redis per group of models: the Router picks each model's Redis (two real ones)."""

from __future__ import annotations

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from helpers import wait_until
from tandem.broker import keys
from tandem.broker.errors import BadSetting, UnknownModel
from tandem.broker.table import Table
from tandem.producers.router import Router, parse_map
from tandem.server import RedisServer
from tandem.stack import spawn, stop_process, wait_for_executors


def test_each_model_is_served_by_the_redis_the_map_names(processes, settings, r, tmp_path):
    """sim:1 on the test Redis, sim:2 on a second one, each with its own worker."""
    second = RedisServer(tmp_path / "second").start()
    other = redis.Redis.from_url(second.url)
    worker = None
    try:
        processes.worker("w1")
        w2 = settings.replace(redis_url=second.url, models=("sim:2",), hostname="w2@test")
        worker = spawn(["worker"], w2, tmp_path / "w2.log")
        wait_for_executors(other, 1, 60, [worker])
        router = Router({"sim:1": settings.redis_url, "sim": second.url})
        with router:
            one = router.submit("sim:1", [1])
            many = router.submit_many("sim:2", [[2], [3]])
            assert one.get(timeout=30) == [1]
            assert [x.get(timeout=30) for x in many] == [[2], [3]]
            assert router.url_for("sim:7") == second.url  # NAME covers every version
            with pytest.raises(UnknownModel, match="no Redis is mapped"):
                router.submit("other:1", [0])
        assert r.exists(keys.result(one.id)) and not other.exists(keys.result(one.id))
        assert all(
            other.exists(keys.result(x.id)) and not r.exists(keys.result(x.id)) for x in many
        )
        wait_until(lambda: sum(e.tasks for e in Table(other).executors("sim:2")) == 2, 10, "stored")
    finally:
        if worker is not None:
            stop_process(worker, 30)
        other.close()
        second.stop()


def test_a_default_redis_takes_every_model_the_map_does_not_name():
    router = Router({"sim:1": "redis://a:1/0"}, default="redis://b:1/0")
    assert router.url_for("sim:1") == "redis://a:1/0"
    assert router.url_for("sim:2") == "redis://b:1/0"


def test_the_map_reads_from_the_environment(monkeypatch):
    monkeypatch.setenv("TANDEM_REDIS_MAP", " sim=redis://a:1/0 , minilm:1=redis://b:1/0 ,")
    assert Router().redis_for == {"sim": "redis://a:1/0", "minilm:1": "redis://b:1/0"}


@pytest.mark.parametrize("text", ["sim", "sim=", "=redis://a", "a b=redis://a", "s:1:2=redis://a"])
def test_a_malformed_map_entry_is_named(text):
    with pytest.raises(BadSetting, match="is not MODEL=REDIS_URL"):
        parse_map(text)


@given(st.text())
def test_any_map_text_parses_or_is_refused_with_bad_setting(text):
    try:
        parsed = parse_map(text)
    except BadSetting:
        return
    assert all(url and "," not in url for url in parsed.values())
