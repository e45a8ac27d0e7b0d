"""Settings precedence: CLI flags, then TANDEM_* env vars, then defaults."""

import re

import pytest

from tandem.broker.errors import BadSetting
from tandem.broker.settings import Settings, load_settings


def test_defaults():
    assert load_settings(env={}) == Settings()


def test_env_overrides_defaults_and_flags_override_env():
    env = {"TANDEM_MAX_BATCH": "8", "TANDEM_MODELS": "a:1, b:2", "TANDEM_MAX_WAIT_MS": "2.5"}
    assert load_settings(env=env).max_batch == 8
    assert load_settings(env=env).models == ("a:1", "b:2")
    assert load_settings(env=env).max_wait_ms == 2.5
    assert load_settings(env=env, max_batch=4).max_batch == 4
    assert load_settings(env=env, models=("c:1",)).models == ("c:1",)


def test_empty_flags_fall_through():
    assert load_settings(env={"TANDEM_MODELS": "x:1"}, models=()).models == ("x:1",)


def test_bad_env_values_name_the_variable():
    with pytest.raises(ValueError, match="TANDEM_MAX_BATCH"):
        load_settings(env={"TANDEM_MAX_BATCH": "many"})


def test_unknown_settings_are_refused():
    with pytest.raises(TypeError, match="unknown settings: nope"):
        load_settings(env={}, nope=1)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"max_batch": 0}, "max_batch must be a finite number >= 1, got 0"),
        ({"max_wait_ms": -1.0}, "max_wait_ms must be a finite number >= 0"),
        ({"max_wait_ms": float("nan")}, "max_wait_ms must be a finite number"),
        ({"poll_ms": 0.0}, "poll_ms must be"),
        ({"result_expires_s": 0}, "result_expires_s must be a finite number >= 1"),
        ({"max_queue": -5}, "max_queue must be"),
        ({"heartbeat_s": 2.0, "heartbeat_ttl_s": 1.0}, "heartbeat_ttl_s (1.0) must exceed"),
    ],
)
def test_settings_out_of_range_are_refused_with_one_line(flags, message):
    with pytest.raises(BadSetting, match=re.escape(message)):
        load_settings(env={}, **flags)


def test_every_problem_is_named_at_once():
    with pytest.raises(BadSetting) as info:
        load_settings(
            env={"TANDEM_MAX_BATCH": "many", "TANDEM_POLL_MS": "0"}, max_queue=-1, slo_ms=-2
        )
    text = str(info.value)
    for named in ("TANDEM_MAX_BATCH='many'", "poll_ms must be", "max_queue must be", "slo_ms"):
        assert named in text


def test_env_values_out_of_range_are_refused_too():
    with pytest.raises(BadSetting, match="max_batch must be"):
        load_settings(env={"TANDEM_MAX_BATCH": "-3"})


def test_a_worker_with_a_bad_setting_exits_with_one_line(settings):
    from helpers import tandem

    done = tandem("worker", "--max-batch", "0", redis_url=settings.redis_url)
    assert done.returncode == 1
    assert "error: BadSetting: max_batch must be a finite number >= 1, got 0" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_redis_map_and_server_are_settings_like_the_rest(monkeypatch):
    """TANDEM_REDIS_MAP and TANDEM_REDIS_SERVER are read where every setting is."""
    from tandem.producers.router import Router
    from tandem.server import redis_binary

    monkeypatch.setenv("TANDEM_REDIS_MAP", "sim=redis://a:1/0")
    monkeypatch.setenv("TANDEM_REDIS_SERVER", "/opt/redis/bin/redis-server")
    assert load_settings().redis_map == "sim=redis://a:1/0"
    assert Router().redis_for == {"sim": "redis://a:1/0"}
    assert redis_binary() == "/opt/redis/bin/redis-server"


def test_the_help_texts_state_the_defaults_settings_have():
    from click.testing import CliRunner

    from tandem.cli import main

    defaults = Settings()
    worker = CliRunner().invoke(main, ["worker", "--help"]).output
    assert f"Largest batch (default {defaults.max_batch})" in worker
    coordinator = " ".join(CliRunner().invoke(main, ["coordinator", "--help"]).output.split())
    assert f"(default {defaults.max_deliveries})" in coordinator


def test_a_redis_is_named_by_the_flag_or_the_environment_alone():
    from tandem.broker.settings import names_redis

    assert names_redis("redis://a:1/0", env={})
    assert names_redis(None, env={"TANDEM_REDIS_URL": "redis://a:1/0"})
    assert not names_redis(None, env={"TANDEM_MAX_BATCH": "4"})
