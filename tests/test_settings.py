"""Settings precedence: CLI flags, then TANDEM_* env vars, then defaults."""

import pytest

from broker.settings import Settings, load_settings


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
