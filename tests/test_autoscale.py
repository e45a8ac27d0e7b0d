"""`tandem up --min-workers N --max-workers M`: the workers follow the coordinator's
scaling signal out under load and back in after it, the idlest first, and every task a
stopped worker held is answered exactly once. A standby worker waits, imported and
holding nothing, for the next scale-out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import psutil
import redis

from helpers import wait_until
from tandem.broker.errors import Overloaded
from tandem.broker.settings import Settings
from tandem.broker.table import Table
from tandem.producers.client import Client
from tandem.stack import Stack

#: sim at 100 ms a batch of at most 4 (about 40 tasks/s a worker), a short down window.
ENV = {
    "TANDEM_SIM_BASE_MS": "100",
    "TANDEM_SIM_PER_ITEM_MS": "0",
    "TANDEM_MAX_BATCH": "4",
    "TANDEM_SLO_MS": "3000",
    "TANDEM_SCALE_DOWN_WINDOW_S": "3",
}


def live_workers(client: redis.Redis) -> set[str]:
    now = Table(client).now_ms()
    return {e.worker for e in Table(client).executors() if e.expires_ms > now}


def test_up_scales_out_under_load_and_back_in_after_losing_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    up = subprocess.Popen(
        ["tandem", "up", "--min-workers", "1", "--max-workers", "3"],
        cwd=tmp_path,
        env={**env, **ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        banner = wait_until(lambda: "tandem up on" in up.stdout.readline(), 90, "the stack")
        assert banner
        url = json.loads((tmp_path / ".tandem" / "stack.json").read_text())["url"]
        r = redis.Redis.from_url(url)
        assert len(live_workers(r)) == 1
        pids = json.loads((tmp_path / ".tandem" / "stack.json").read_text())["pids"]
        assert "worker2" in pids  # the standby: started, not serving
        accepted, peak = [], set()
        with Client(url) as client:
            start = time.monotonic()
            while time.monotonic() - start < 40 and len(peak) < 3:
                try:  # about 150 tasks/s: four workers' worth, refused past the deadline
                    accepted += client.submit_many("sim:1", [[n] for n in range(15)], deadline_s=2)
                except Overloaded as e:
                    accepted += e.accepted
                peak = live_workers(r)
                time.sleep(0.1)  # pacing the offered load, not synchronisation
            assert len(peak) == 3, f"scaled to {len(peak)} workers"
            # The load stops: after the signal's windows, back to one, the idlest first.
            wait_until(lambda: len(live_workers(r)) == 1, 60, "the scale-in")
            answered = [res.get(timeout=30, propagate=False) for res in accepted]
        assert len(answered) == len(accepted)
        stats = Table(r).stats()
        assert stats.get("duplicates", 0) == 0  # exactly once
        wait_until(
            lambda: (
                sum(
                    Table(r).counters("sim:1").get(f"outcome:{o}", 0)
                    for o in ("SUCCESS", "FAILURE")
                )
                == len(accepted)
            ),
            10,
            "every accepted task counted once",
        )
        logs = (tmp_path / ".tandem" / "logs").glob("worker*.log")
        stopped = [p for p in logs if "stopped; handed" in p.read_text()]
        assert len(stopped) == 2  # each retired warmly
        pids = json.loads((tmp_path / ".tandem" / "stack.json").read_text())["pids"]
        r.close()
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(60)
    left = [name for name, pid in pids.items() if psutil.pid_exists(pid)]
    assert left == [], f"still running after up stopped: {left}"


def names(client: redis.Redis) -> set[str]:
    """The node names of the registered executors' workers, without their host."""
    return {e.worker.partition("@")[0] for e in Table(client).executors()}


def test_a_standby_worker_serves_once_added_and_stops_with_the_stack(tmp_path):
    settings = Settings().replace(models=("sim:1",), loglevel="WARNING")
    with Stack(settings, workers=1, data_dir=tmp_path, standby=2) as stack:
        r = redis.Redis.from_url(stack.url)
        first, second = stack.spares
        assert {first.name, second.name} == {"worker2", "worker3"}
        assert names(r) == {"worker1"}  # the spares register nothing
        worker = stack.add_worker()
        assert worker is first and stack.spares[0] is second and len(stack.spares) == 2
        wait_until(lambda: names(r) == {"worker1", "worker2"}, 60, "the spare to register")
        with Client(stack.url) as client:
            results = client.submit_many("sim:1", [[n] for n in range(20)])
            assert [res.get(timeout=30) for res in results] == [[float(n)] for n in range(20)]
        assert names(r) == {"worker1", "worker2"}
        r.close()
        everything = [*stack.processes, *stack.spares]
    assert all(p.poll() is not None for p in everything)


def test_a_standby_worker_whose_stdin_closes_exits_having_loaded_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    done = subprocess.run(
        ["tandem", "worker", "--standby", "--model", "sim:1", "--loglevel", "INFO"],
        input="",
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**env, "TANDEM_REDIS_URL": "redis://127.0.0.1:1/0"},  # never reached
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "loading" not in done.stdout + done.stderr


def test_a_standby_worker_that_dies_is_named_as_a_worker_would_be(tmp_path):
    settings = Settings().replace(models=("sim:1",), loglevel="WARNING")
    with Stack(settings, workers=1, data_dir=tmp_path, standby=1) as stack:
        (spare,) = stack.spares
        spare.kill()  # as the OOM killer would
        error = wait_until(stack.exited, 30, "the stack to see its spare gone")
        assert spare.name in str(error) and "-9" in str(error)
        assert stack.add_worker() is not spare  # a new process serves instead
