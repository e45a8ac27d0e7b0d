"""A new user's path with real processes: up and the commands after it, clear failures."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess

import psutil
import pytest
import redis

from helpers import start_up, tandem, wait_until
from tandem.broker import keys
from tandem.broker.discovery import STACK_FILE, stack_url
from tandem.broker.table import Table
from tandem.stack import spawn, stop_process


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_commands_run_after_up_in_its_folder_find_its_redis(tmp_path):
    up, banner = start_up(tmp_path, "--workers", "1")
    try:
        assert str(STACK_FILE) in banner
        url = stack_url(tmp_path / STACK_FILE)
        assert url and url in banner and ":6379" not in url
        done = tandem("submit", "sim:1", "[1, 2]", cwd=tmp_path)  # no --redis, no env
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["result"] == [1, 2]
        status = tandem("status", "--json", cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        assert [e["model"] for e in json.loads(status.stdout)["executors"]] == ["sim:1"]
        # A second stack in the same folder would share the first one's data: refused.
        again = tandem("up", cwd=tmp_path, timeout=60)
        assert again.returncode == 1
        assert f"a tandem up is already running in this folder, on {url}" in again.stderr
        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 0
        assert not (tmp_path / STACK_FILE).exists()
        if port_is_free(6379):  # once up has stopped, status says no stack runs here
            gone = tandem("status", cwd=tmp_path)
            assert gone.returncode == 1
            assert "no `tandem up` runs in this folder" in gone.stderr
    finally:
        if up.poll() is None:
            up.kill()


def test_a_stale_stack_file_is_ignored(tmp_path, redis_server):
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / STACK_FILE).parent.mkdir()
    (tmp_path / STACK_FILE).write_text(json.dumps({"url": redis_server.url, "pid": dead.pid}))
    assert stack_url(tmp_path / STACK_FILE) is None
    for junk in ("", "[]", '{"url": 1, "pid": "x"}', '{"url": "redis://x", "pid": -1}', "\x00"):
        (tmp_path / STACK_FILE).write_text(junk)
        assert stack_url(tmp_path / STACK_FILE) is None
    if port_is_free(6379):
        done = tandem("status", cwd=tmp_path)
        assert done.returncode == 1
        assert "cannot reach Redis" in done.stderr and "localhost:6379" in done.stderr
        assert "(its .tandem/stack.json is from one that stopped)" in done.stderr
        (line,) = done.stderr.strip().splitlines()


def test_up_names_the_worker_that_died_and_exits_1(tmp_path):
    up, banner = start_up(tmp_path, "--workers", "2")
    try:
        client = redis.Redis.from_url(stack_url(tmp_path / STACK_FILE))
        victim = next(e for e in Table(client).executors() if e.worker.startswith("worker2@"))
        os.kill(int(client.hget(keys.executor(victim.id), "pid")), signal.SIGKILL)
        out, _ = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 1, out
    assert "error: ProcessExited: worker2 exited with code -9" in out
    assert (
        "the last lines it wrote to its log" in out
        and str(STACK_FILE.parent / "logs" / "worker2.log") in out
    )
    assert "Traceback" not in out


def test_demo_names_a_worker_that_cannot_start(tmp_path):
    logs = tmp_path / STACK_FILE.parent / "logs"
    logs.mkdir(parents=True)
    for n in (1, 2):  # an earlier run's lines: logs are appended across runs
        (logs / f"worker{n}.log").write_text("error: an earlier run's failure\n")
    done = tandem("demo", "--model", "nope:1", "--seconds", "1", cwd=tmp_path, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    # Both workers fail; whichever exits first is the one named.
    named = re.search(r"error: ProcessExited: (worker[12]) exited with code 1", done.stderr)
    assert named, done.stderr
    assert "no model 'nope'" in done.stderr  # the tail of the worker's own log
    assert f".tandem/logs/{named.group(1)}.log" in done.stderr
    assert "an earlier run's failure" not in done.stderr  # only what this run wrote
    assert "Traceback" not in done.stderr


def test_a_bench_point_aborts_when_a_baseline_worker_dies(tmp_path):
    pytest.importorskip("celery_batches")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    bench = subprocess.Popen(
        ["tandem", "bench", "--systems", "celery-plain", "--rates", "20", "--seconds", "120"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def baseline_pid() -> int | None:
            """This bench's own baseline worker: another test's bench may run one of the
            same name at the same time (pytest-xdist), and it must not be the one killed."""
            for child in psutil.Process(bench.pid).children(recursive=True):
                try:
                    if "--hostname=plain1@bench" in " ".join(child.cmdline()):
                        return child.pid
                except psutil.NoSuchProcess:
                    continue
            return None

        os.kill(wait_until(baseline_pid, 60, "the baseline worker"), signal.SIGKILL)
        out, err = bench.communicate(timeout=60)  # far sooner than the 120 s of arrivals
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 1, out + err
    assert "bench point celery-plain at 20/s aborted" in err
    assert "plain1 exited with code -9" in err
    assert "Traceback" not in err


def test_workers_without_a_hostname_get_distinct_node_names(settings, r, tmp_path):
    bare = settings.replace(hostname="")
    workers = [spawn(["worker"], bare, tmp_path / f"w{n}.log") for n in range(2)]
    try:
        wait_until(lambda: len(Table(r).executors()) == 2, 60, "two executors")
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        ping = subprocess.run(
            ["celery", "--broker", settings.redis_url, "inspect", "ping", "--json", "-t", "5"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert ping.returncode == 0, ping.stdout + ping.stderr
        nodes = set(json.loads(ping.stdout))
        pids = {str(w.pid) for w in workers}
        assert len(nodes) == 2
        assert {re.fullmatch(r"sim\.1-(\d+)@.+", n).group(1) for n in nodes} == pids
        assert "duplicate" not in (tmp_path / "w0.log").read_text().lower()
    finally:
        for worker in workers:
            stop_process(worker)


@pytest.mark.skipif(not port_is_free(6379), reason="a Redis listens on localhost:6379 here")
def test_the_python_client_says_why_it_tried_localhost(tmp_path, monkeypatch):
    """As the commands do: outside an `up` folder, with no URL named, the error says so."""
    from tandem.broker.errors import BrokerUnavailable
    from tandem.producers.client import Client

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TANDEM_REDIS_URL", raising=False)
    with Client() as client:
        for submit in (
            lambda: client.submit("sim:1", [1]),
            lambda: client.submit_many("sim:1", [[1]]),
        ):
            with pytest.raises(BrokerUnavailable, match="no `tandem up` runs in this folder"):
                submit()
    with Client("redis://127.0.0.1:6379/0") as named:  # named: nothing to explain
        with pytest.raises(BrokerUnavailable) as refused:
            named.submit("sim:1", [1])
        assert "tandem up" not in str(refused.value)
