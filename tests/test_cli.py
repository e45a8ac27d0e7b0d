"""The `tandem` command line, run as a user runs it."""

from __future__ import annotations

import json
import re
import signal

import pytest
import redis
import torch

from helpers import start_up, tandem, wait_until
from tandem.broker.table import Table
from tandem.producers.client import Client


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


@pytest.mark.skipif(torch.cuda.device_count() > 8, reason="this host sees cuda:8")
@pytest.mark.parametrize("device", ["cuda:8", "nonsense"])
def test_a_worker_refuses_a_device_it_cannot_see(settings, device):
    done = tandem("worker", "--device", device, redis_url=settings.redis_url)
    assert done.returncode == 1
    expected = "is not visible: this process sees" if device == "cuda:8" else "not a torch device"
    assert "error: BadSetting: device" in done.stderr and expected in done.stderr
    assert "Traceback" not in done.stderr


def test_up_runs_a_local_stack_until_ctrl_c(tmp_path):
    up, line = start_up(tmp_path, "--workers", "2")
    try:
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


def test_status_prints_names_with_brackets_as_they_are():
    """Executor ids hold the worker's --hostname, which may hold brackets: never markup."""
    from rich.console import Console

    from tandem.status import tables

    data = {
        "executors": [
            {"id": "w[embed]@h/sim:1/ab12", "model": "sim:1", "state": "IDLE", "batches": 1,
             "tasks": 1, "mean_batch": 1.0, "l2": 0, "inflight": 0}
        ],
        "queues": [
            {"model": "sim:1", "queue": "tandem.l1.sim.1", "l1": 0, "retry": 0,
             "live_executors": 1, "capacity_rps": None, "predicted_wait_ms": None,
             "offered_rps": None, "capacity_per_executor_rps": None, "executors_wanted": None}
        ],
        "poison": 0,
        "dead_letters": 0,
    }  # fmt: skip
    console = Console(record=True, width=200)
    console.print(tables(data))
    assert "w[embed]@h/sim:1/ab12" in console.export_text()


def test_submit_without_a_live_executor_is_one_line_with_the_task_and_the_queue(
    processes, settings, r
):
    worker = processes.worker("w1")
    worker.kill()  # SIGKILL: its executor stays registered until its heartbeat lapses
    worker.wait()
    table = Table(r)
    wait_until(
        lambda: all(x.expires_ms < table.now_ms() for x in table.executors("sim:1")),
        10,
        "the dead executor's heartbeat to lapse",
    )
    done = tandem("submit", "sim:1", "[1]", "--timeout", "1", redis_url=settings.redis_url)
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert re.fullmatch(
        r"error: no result for task [0-9a-f-]{36} in 1 s; sim:1 has 1 task\(s\) in its "
        r"first-level queue and 0 live executor\(s\): start a worker \(tandem worker\)",
        line,
    ), line


def test_a_failed_task_is_one_line_with_its_id(processes, settings, tmp_path):
    """The task's own error in its last line, not a whole (TorchScript) traceback."""
    processes.worker("w1", models=("tiny:1",))
    done = tandem("submit", "tiny:1", "[1, 2]", redis_url=settings.redis_url)  # not 8 numbers
    assert done.returncode == 1, done.stdout
    (line,) = done.stderr.strip().splitlines()
    assert re.match(r"error: task [0-9a-f-]{36} failed: \w+: ", line), line


def test_every_option_of_every_command_says_what_it_does():
    import click

    from tandem.cli import main

    ctx = click.Context(main)
    bare = [
        f"{name} {param.opts[0]}"
        for name in main.list_commands(ctx)
        for param in main.get_command(ctx, name).params
        if isinstance(param, click.Option) and not param.help
    ]
    assert bare == []


def test_version_is_the_installed_package_version():
    from importlib.metadata import version

    done = tandem("--version")
    assert (
        done.returncode == 0 and done.stdout.strip() == f"tandem, version {version('tandem-serve')}"
    )
