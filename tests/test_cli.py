"""The `tandem` command line, run as a user runs it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import redis

from broker.table import Table
from helpers import tandem, wait_until
from producers.client import Client


def test_submit_prints_the_result(processes, settings):
    processes.worker("w1")
    done = tandem("submit", "sim:1", '{"x": [1, 2]}', redis_url=settings.redis_url)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["result"] == {"x": [1, 2]}
    assert out["route"] == "L2"


def test_submit_explains_bad_json_and_unknown_models(processes, settings):
    processes.worker("w1")
    bad = tandem("submit", "sim:1", "{nope", redis_url=settings.redis_url)
    assert bad.returncode == 2
    assert "INPUTS_JSON" in bad.stderr
    unknown = tandem("submit", "nope:1", "[1]", redis_url=settings.redis_url)
    assert unknown.returncode == 1
    assert "error: UnknownModel: no worker serves nope:1" in unknown.stderr
    assert "Traceback" not in unknown.stderr


def test_status_shows_executors_and_queues(processes, settings):
    processes.worker("w1", models=("sim:1", "tiny:1"))
    done = tandem("status", redis_url=settings.redis_url)
    assert done.returncode == 0, done.stderr
    assert "tandem.l1.sim.1" in done.stdout
    assert "tandem.l1.tiny.1" in done.stdout
    assert done.stdout.count("IDLE") == 2


def test_a_worker_refuses_an_unknown_model(settings):
    done = tandem("worker", "--model", "resnet:1", redis_url=settings.redis_url)
    assert done.returncode == 1
    assert "no model 'resnet': not built in (sim, tiny) and not in" in done.stderr


def test_up_runs_a_local_stack_until_ctrl_c(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    up = subprocess.Popen(
        ["tandem", "up", "--workers", "2"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = wait_until(lambda: _line_with(up, "tandem up on"), 60, "the stack")
        url = re.search(r"redis://\S+?(?=:\s)", line).group(0)
        client = redis.Redis.from_url(url)
        assert len(Table(client).executors()) == 2
        assert (tmp_path / ".tandem" / "redis" / "appendonlydir").exists() or any(
            p.suffix == ".aof" for p in (tmp_path / ".tandem" / "redis").iterdir()
        )
        with Client(url) as producer:
            assert producer.submit("sim:1", [7]).get(timeout=10) == [7]
        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 0
    finally:
        if up.poll() is None:
            up.kill()


def _line_with(process: subprocess.Popen, text: str) -> str | None:
    line = process.stdout.readline()
    if not line and process.poll() is not None:
        raise AssertionError(f"tandem up exited with {process.returncode}")
    return line if text in line else None


def test_demo_runs_and_reports(tmp_path):
    done = tandem("demo", "--seconds", "1", "--rates", "10,200", cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tandem demo: sim:1" in done.stdout
    assert "p99 ms" in done.stdout
    assert re.search(r"\b200\.0\b", done.stdout)
