"""`tandem up` in a terminal, stopped as an operator stops it: one Ctrl-C, two, or `up`
itself killed, each with tasks in flight. None leaves a process behind, and the next
`up` in the same folder answers every task the first one accepted."""

from __future__ import annotations

import json
import os
import pty
import signal
import threading
import time
from pathlib import Path

import psutil
import redis

from helpers import start_up, wait_until
from tandem.broker import keys
from tandem.producers.client import Client
from tandem.stack import STOP_BOUND_S

CTRL_C = b"\x03"


class Terminal:
    """A command on a pseudo-terminal, in the terminal's foreground process group, as a
    shell runs it: Ctrl-C typed there reaches that whole group."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.output = b""
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: exec at once
            os.chdir(cwd)
            os.execvpe(args[0], args, env)
        self.status: int | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:
                return  # the terminal closed
            if not chunk:
                return
            self.output += chunk

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def shows(self, text: str) -> bool:
        return text.encode() in self.output

    def exited(self) -> bool:
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
        return self.status is not None

    def kill(self) -> None:
        if not self.exited():
            os.kill(self.pid, signal.SIGKILL)
            wait_until(self.exited, 10, "the killed process to be reaped")


def up_in_terminal(folder: Path, **env: str) -> tuple[Terminal, dict]:
    """`tandem up --workers 2` on a terminal in folder; returns it and its stack file."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    terminal = Terminal(["tandem", "up", "--workers", "2"], folder, {**clean, **env})
    wait_until(lambda: terminal.shows("Ctrl-C stops") or terminal.exited(), 90, "the stack")
    assert not terminal.exited(), terminal.output.decode(errors="replace")
    return terminal, json.loads((folder / ".tandem" / "stack.json").read_text())


def running(pids: dict[str, int]) -> list[str]:
    """The names of the processes still running (a zombie is not running)."""
    out = []
    for name, pid in pids.items():
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(name)
        except psutil.NoSuchProcess:
            pass
    return out


def submit_in_flight(stack: dict, count: int = 400) -> list[str]:
    """Tasks accepted by the stack: their ids."""
    with Client(stack["url"]) as client:
        return [r.id for r in client.submit_many("sim:1", [[n] for n in range(count)])]


def answered_by_next_up(folder: Path, task_ids: list[str]) -> None:
    """The next `up` in the folder stores a SUCCESS for every one of task_ids."""
    up, _ = start_up(folder, "--workers", "1")
    try:
        url = json.loads((folder / ".tandem" / "stack.json").read_text())["url"]
        client = redis.Redis.from_url(url)

        def done() -> bool:
            metas = client.mget([keys.result(t) for t in task_ids])
            return all(m and json.loads(m)["status"] == "SUCCESS" for m in metas)

        wait_until(done, 90, "every accepted task's result")
        client.close()
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(STOP_BOUND_S + 10)


def test_a_ctrl_c_stops_the_workers_then_the_coordinator_then_redis(tmp_path):
    # Batches of 100 ms: work is in flight when the Ctrl-C comes.
    terminal, stack = up_in_terminal(tmp_path, TANDEM_SIM_BASE_MS="100")
    try:
        accepted = submit_in_flight(stack)
        started = time.monotonic()
        terminal.type(CTRL_C)
        wait_until(terminal.exited, STOP_BOUND_S + 10, "up to stop")
        assert time.monotonic() - started < STOP_BOUND_S
        assert terminal.status == 0, terminal.output.decode(errors="replace")
        assert running(stack["pids"]) == []
    finally:
        terminal.kill()
    logs = tmp_path / ".tandem" / "logs"
    for n in (1, 2):  # each worker stopped with Redis still there: it handed back
        log = (logs / f"worker{n}.log").read_text()
        assert "stopped; handed" in log and "stopped without Redis" not in log, log
        assert "could not mark itself STOPPING" not in log, log
    assert not (tmp_path / ".tandem" / "stack.json").exists()
    answered_by_next_up(tmp_path, accepted)


def test_a_second_ctrl_c_stops_everything_at_once(tmp_path):
    # Batches of 5 s: the first Ctrl-C's stop waits for one, so the second comes during it.
    terminal, stack = up_in_terminal(tmp_path, TANDEM_SIM_BASE_MS="5000")
    try:
        accepted = submit_in_flight(stack, 100)
        wait_until(
            lambda: any(
                e["state"] == "WORKING"
                for e in _executors(stack["url"])  # a batch computes: the stop must wait
            ),
            30,
            "a batch to compute",
        )
        terminal.type(CTRL_C)
        wait_until(lambda: terminal.shows("Ctrl-C again"), 30, "up to begin stopping")
        terminal.type(CTRL_C)
        wait_until(terminal.exited, 15, "up to stop at once")
        assert terminal.status == 130
        assert terminal.shows("stopped at once")
        assert running(stack["pids"]) == []
    finally:
        terminal.kill()
    answered_by_next_up(tmp_path, accepted)


def test_up_killed_takes_its_stack_with_it(tmp_path):
    terminal, stack = up_in_terminal(tmp_path, TANDEM_SIM_BASE_MS="100")
    accepted = submit_in_flight(stack)
    terminal.kill()  # SIGKILL: up can do nothing; its children see it gone
    wait_until(lambda: not running(stack["pids"]), STOP_BOUND_S, "the stack to stop")
    for n in (1, 2):  # the workers stopped warmly, while Redis was still there
        log = (tmp_path / ".tandem" / "logs" / f"worker{n}.log").read_text()
        assert "lifeline closed" in log and "stopped; handed" in log, log
    answered_by_next_up(tmp_path, accepted)


def _executors(url: str) -> list[dict]:
    from tandem.broker.table import Table

    client = redis.Redis.from_url(url)
    try:
        return [{"state": e.state} for e in Table(client).executors()]
    finally:
        client.close()


def test_a_ctrl_c_during_the_demo_leaves_nothing_behind(tmp_path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    terminal = Terminal(
        ["tandem", "demo", "--workers", "1", "--rates", "50", "--seconds", "120"], tmp_path, clean
    )
    try:
        wait_until(lambda: terminal.shows("Poisson load") or terminal.exited(), 90, "the load")
        stack = json.loads((tmp_path / ".tandem" / "stack.json").read_text())
        terminal.type(CTRL_C)
        wait_until(terminal.exited, STOP_BOUND_S + 10, "the demo to stop")
        assert running(stack["pids"]) == []
    finally:
        terminal.kill()


def test_a_second_ctrl_c_on_a_worker_hands_back_at_once_and_loses_nothing(processes, settings):
    worker = processes.worker("w1", sim_base_ms=50)
    log = processes.logs / "w1.log"
    with Client(settings=settings) as client:
        results = client.submit_many("sim:1", [[n] for n in range(2000)])
        wait_until(results[0].ready, 10, "the burst to be under way")
        worker.send_signal(signal.SIGINT)
        wait_until(lambda: "Ctrl+C again" in log.read_text(), 10, "the warm shutdown")
        worker.send_signal(signal.SIGINT)  # Celery's cold shutdown
        worker.wait(30)
        text = log.read_text()
        assert "terminated; handed" in text and "Traceback" not in text, text[-3000:]
        processes.worker("w2", idle=False)  # every task is answered, by the next worker
        assert [r.get(timeout=60) for r in results] == [[n] for n in range(2000)]


def test_a_worker_stopped_while_it_loads_its_model_exits_cleanly(settings, tmp_path):
    """A scale-in that changed its mind: SIGTERM during the model's load (a cold start)
    ends the worker at once with 0, holding nothing, never registered."""
    import subprocess
    import sys

    log = tmp_path / "worker.log"
    env = {**os.environ, "TANDEM_REDIS_URL": settings.redis_url, "TANDEM_SIM_LOAD_S": "120"}
    with log.open("w") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "tandem.cli", "worker"], env=env, stdout=out, stderr=out
        )
    try:
        wait_until(lambda: "loading sim:1" in log.read_text(), 60, "the load under way")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(10) == 0, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
    assert "stopped while loading its models" in log.read_text()
    registered = redis.Redis.from_url(settings.redis_url).smembers(keys.executors("sim:1"))
    assert not [e for e in registered if f"-{worker.pid}@".encode() in e]  # never registered
