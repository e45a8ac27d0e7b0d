"""Operating tandem with real tools: Flower, Prometheus metrics, status, scaling."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_cli import tandem

from helpers import executors_of, plain_celery, wait_until
from tandem.broker.errors import BadInput
from tandem.broker.table import Table
from tandem.producers.client import Client
from tandem.server import free_port


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@pytest.fixture
def flower(settings, r, tmp_path):
    port = free_port()
    # As compose runs it: the app of tandem.broker.celeryapp, its broker from TANDEM_REDIS_URL.
    env = {
        **os.environ,
        "FLOWER_UNAUTHENTICATED_API": "true",
        "TANDEM_REDIS_URL": settings.redis_url,
    }
    log = open(tmp_path / "flower.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tandem.broker.celeryapp",
            "flower",
            f"--port={port}",
            "--address=127.0.0.1",
            "--inspect_timeout=3000",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: _up(base, process), 60, "Flower to answer")
    yield base
    process.send_signal(signal.SIGTERM)
    process.wait(20)
    log.close()


def _up(base: str, process) -> bool:
    if process.poll() is not None:
        raise AssertionError("flower exited")
    try:
        return get_json(f"{base}/api/tasks") is not None
    except OSError:
        return False


def test_flower_shows_every_task_and_the_executors(processes, settings, flower):
    worker = processes.worker("w1", models=("sim:1", "tiny:1"))
    with Client(settings=settings.replace(send_sent_event=True)) as client:
        # Flower sees only events sent after its receiver is bound: wait for a canary.
        wait_until(
            lambda: (
                client.submit("sim:1", ["canary"]).get(timeout=10)
                and any(
                    t["result"] == "['canary']" for t in get_json(f"{flower}/api/tasks").values()
                )
            ),
            30,
            "Flower to see a canary task",
        )
        good = client.submit_many("sim:1", [[n] for n in range(5)])
        bad = client.submit("tiny:1", [1.0])
        for res in good:
            res.get(timeout=10)
        with pytest.raises(Exception, match="tiny expects"):
            bad.get(timeout=10)
        # Revoked while it waits in L1 (the worker stopped): skipped, and Flower says so.
        worker.send_signal(signal.SIGSTOP)
        try:
            waiting = plain_celery(settings).send_task(
                "tandem.infer", kwargs={"model": "sim:1", "inputs": [0]}, queue="tandem.l1.sim.1"
            )
            client.revoke(waiting.id)
        finally:
            worker.send_signal(signal.SIGCONT)

    def tasks():
        found = get_json(f"{flower}/api/tasks")
        wanted = [*good, bad, waiting]
        if all(r.id in found for r in wanted) and found[waiting.id]["state"] == "REVOKED":
            return found
        return None

    found = wait_until(tasks, 30, "Flower to list the tasks")
    for res in good:
        task = found[res.id]
        assert (task["state"], task["name"], task["worker"]) == (
            "SUCCESS",
            "tandem.infer",
            "w1@test",
        )
        assert task["received"] and task["started"] and task["runtime"] >= 0.02
        assert task["sent"]  # task-sent from the client: PENDING before a worker took it
    assert found[bad.id]["state"] == "FAILURE"
    assert "tiny expects" in found[bad.id]["exception"]
    workers = wait_until(
        lambda: get_json(f"{flower}/api/workers?refresh=1").get("w1@test"),
        30,
        "Flower to list the worker",
    )
    rows = workers["stats"]["tandem"]
    assert {row["model"] for row in rows} == {"sim:1", "tiny:1"}
    sim = next(row for row in rows if row["model"] == "sim:1")
    assert sim["tasks"] >= 6 and sim["state"] == "IDLE" and sim["l2_depth"] == 0


def scrape(port: int) -> dict:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_move_under_load(processes, settings, r):
    port = free_port()
    processes.coordinator(metrics_port=port)
    processes.worker("w1", sim_base_ms=200.0)
    wait_until(lambda: _scrapes(port), 30, "the metrics endpoint")
    before = scrape(port)
    assert value(before, "tandem_executors", model="sim:1", state="IDLE") == 1
    with Client(settings=settings) as client:
        results = client.submit_many("sim:1", [[n] for n in range(100)])
        during = wait_until(
            lambda: (s := scrape(port)) and value(s, "tandem_l1_depth", model="sim:1") > 0 and s,
            10,
            "a backlog in L1",
        )
        assert value(during, "tandem_executors", model="sim:1", state="WORKING") == 1
        for res in results:
            res.get(timeout=30)
    after = scrape_until(port, 100, "tandem_tasks_finished_total", model="sim:1", outcome="SUCCESS")
    assert value(after, "tandem_tasks_routed_total", model="sim:1", route="L2") == 1
    assert value(after, "tandem_tasks_routed_total", model="sim:1", route="L1") == 99
    assert value(after, "tandem_l1_depth", model="sim:1") == 0
    assert value(after, "tandem_batch_size_count", model="sim:1") >= 4
    assert value(after, "tandem_batch_size_bucket", model="sim:1", le="32") == value(
        after, "tandem_batch_size_count", model="sim:1"
    )
    assert value(after, "tandem_latency_ms_count", model="sim:1") == 100
    assert value(after, "tandem_queue_wait_ms_sum", model="sim:1") > 0
    assert value(after, "tandem_compute_ms_sum", model="sim:1") >= 200


def scrape_until(port: int, expected: float, name: str, **labels) -> dict:
    """Scrape until the sample `name{labels}` reaches `expected`; return that scrape."""

    def reached() -> dict | None:
        samples = scrape(port)
        return samples if value(samples, name, **labels) == expected else None

    return wait_until(reached, 10, f"{name}{labels} == {expected}")


def _scrapes(port: int) -> bool:
    try:
        return bool(scrape(port))
    except OSError:
        return False


def test_failures_are_counted_by_reason(processes, settings):
    port = free_port()
    processes.coordinator(metrics_port=port)
    processes.worker("w1", models=("tiny:1",))
    wait_until(lambda: _scrapes(port), 30, "the metrics endpoint")
    with Client(settings=settings) as client:
        for res in client.submit_many("tiny:1", [[1.0], [2.0], [1.0] * 8]):
            with contextlib.suppress(BadInput):  # the two bad ones fail, as they should
                res.get(timeout=10)
    samples = scrape_until(port, 2, "tandem_task_failures_total", model="tiny:1", reason="BadInput")
    assert value(samples, "tandem_tasks_finished_total", model="tiny:1", outcome="SUCCESS") == 1


def test_status_json_and_watch(processes, settings, tmp_path):
    processes.worker("w1")
    done = tandem("status", "--json", redis_url=settings.redis_url)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["executors"][0]["state"] == "IDLE"
    # No batch computed yet: no measured capacity, no predicted wait.
    assert data["queues"] == [
        {
            "model": "sim:1",
            "queue": "tandem.l1.sim.1",
            "l1": 0,
            "retry": 0,
            "live_executors": 1,
            "offered_rps": None,
            "capacity_per_executor_rps": None,
            "executors_wanted": None,
            "capacity_rps": None,
            "predicted_wait_ms": None,
            "stages_ms": dict.fromkeys(("collate", "copy_in", "compute", "copy_out", "split")),
            "device_busy": None,
        }
    ]
    assert data["poison"] == data["dead_letters"] == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    env["TANDEM_REDIS_URL"] = settings.redis_url
    # Into a file, as `tandem status --watch > file`: each refresh is there as it is drawn.
    frames = tmp_path / "watch.txt"
    with open(frames, "w") as out:
        watch = subprocess.Popen(
            ["tandem", "status", "--watch", "--interval", "0.2"],
            env=env,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_until(
                lambda: frames.read_text().count("first-level queues") >= 3, 20, "a few frames"
            )
        finally:
            watch.send_signal(signal.SIGINT)
            _, err = watch.communicate(timeout=20)
    assert watch.returncode == 0, err
    text = frames.read_text()
    assert "tandem.l1.sim.1" in text and "w1@test" in text


def test_a_new_worker_takes_the_l1_backlog_at_once(processes, settings, r):
    busy = processes.worker("w1", sim_base_ms=1000.0)
    with Client(settings=settings) as client:
        results = client.submit_many("sim:1", [[n] for n in range(80)])
        # w1 computes one and, meanwhile, has claimed and prepared the next 32 (pipeline).
        wait_until(lambda: Table(r).l1_depth("sim:1") == 80 - 1 - 32, 10, "the backlog")
        busy.send_signal(signal.SIGSTOP)  # w1 stays busy however long w2 takes to start
        try:
            processes.worker("w2", idle=False)
            newcomer = wait_until(
                lambda: [e for e in executors_of(r, "w2") if e.inflight_depth], 30, "w2 claiming"
            )[0]
        finally:
            busy.send_signal(signal.SIGCONT)
        # A full batch straight from L1, and then, while it computes, the last 15 (pipeline).
        assert newcomer.inflight_depth in (32, 47)
        assert [res.get(timeout=60) for res in results] == [[n] for n in range(80)]
