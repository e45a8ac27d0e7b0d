"""A local stack for `tandem up`, `tandem demo` and tests: Redis, a coordinator, N workers.

Each part runs as its own process, started exactly as an operator would start it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from tandem.broker.discovery import STACK_FILE, stack_url
from tandem.broker.errors import ProcessExited, TandemError
from tandem.broker.settings import Settings
from tandem.broker.table import Table
from tandem.server import RedisServer


def settings_env(settings: Settings) -> dict[str, str]:
    """Settings as TANDEM_* variables, for a child process."""
    env = {}
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if isinstance(value, tuple):
            value = ",".join(value)
        env[f"TANDEM_{field.name.upper()}"] = str(value)
    return env


def log_tail(path: Path, lines: int = 15, start: int = 0) -> str:
    """The last lines of a log file from byte `start` on (what this run wrote: logs are
    appended across runs), or a note that it is missing."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError as e:
        return f"(cannot read {path}: {e})"
    return "\n".join(text.splitlines()[-lines:]) or "(this run wrote nothing to the log)"


class Child(subprocess.Popen):
    """A process started by spawn(): a Popen that knows its name and its log file."""

    def __init__(
        self, args: list[str], *, name: str, log_path: Path, log_start: int = 0, **kwargs
    ) -> None:
        super().__init__(args, **kwargs)
        self.name = name
        self.log_path = log_path
        self.log_start = log_start  # the log's size when this process started

    def exited(self) -> ProcessExited | None:
        """If the process has exited: an error naming it, with its exit code and log tail."""
        code = self.poll()
        if code is None:
            return None
        return ProcessExited(
            f"{self.name} exited with code {code}; the last lines it wrote to its log "
            f"{self.log_path}:\n{log_tail(self.log_path, start=self.log_start)}"
        )

    def check(self) -> None:
        """Raise ProcessExited if the process has exited."""
        if error := self.exited():
            raise error


def spawn(
    args: list[str],
    settings: Settings,
    log_path: Path,
    module: str = "tandem.cli",
    name: str | None = None,
    env: dict[str, str] | None = None,
) -> Child:
    """Start `python -m MODULE ARGS` (by default `tandem ARGS`), its output going to log_path;
    env: more variables for it."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **settings_env(settings), **(env or {})}
    with open(log_path, "ab") as log:
        return Child(
            [sys.executable, "-m", module, *args],
            name=name or log_path.stem,
            log_path=log_path,
            log_start=log.tell(),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_process(process: subprocess.Popen, timeout_s: float = 30.0) -> int:
    """SIGTERM, wait, then SIGKILL if it will not stop. Returns the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def wait_for_executors(
    client: redis.Redis, count: int, timeout_s: float = 60.0, processes: Sequence[Child] = ()
) -> None:
    """Block until `count` executors are registered and IDLE.

    Raises ProcessExited as soon as one of `processes` exits, TandemError at the deadline.
    """
    table = Table(client)
    deadline = time.monotonic() + timeout_s
    while True:
        ready = [e for e in table.executors() if e.state == "IDLE"]
        if len(ready) >= count:
            return
        for process in processes:
            process.check()
        if time.monotonic() > deadline:
            raise TandemError(f"{len(ready)} of {count} executors came up in {timeout_s:g}s")
        time.sleep(0.05)  # polling a condition, bounded by the deadline


class Stack:
    """Redis (embedded unless settings name one), a coordinator and `workers` workers."""

    def __init__(
        self,
        settings: Settings,
        *,
        workers: int = 2,
        embedded: bool = True,
        data_dir: str | Path = STACK_FILE.parent,
    ) -> None:
        self.settings = settings
        self.workers = workers
        self.embedded = embedded
        self.data_dir = Path(data_dir)
        self.server: RedisServer | None = None
        self.processes: list[Child] = []

    @property
    def url(self) -> str:
        return self.settings.redis_url

    @property
    def stack_file(self) -> Path:
        """Where the URL is written for the commands that follow (discovery.STACK_FILE)."""
        return self.data_dir / "stack.json"

    def start(self, timeout_s: float = 60.0) -> Stack:
        if self.embedded:
            if running := stack_url(self.stack_file):
                raise TandemError(
                    f"a tandem up is already running in this folder, on {running}; "
                    "stop it first, or point this command at it with --redis"
                )
            self.server = RedisServer(self.data_dir / "redis").start()
            self.settings = self.settings.replace(redis_url=self.server.url)
            self.stack_file.write_text(json.dumps({"url": self.url, "pid": os.getpid()}))
        logs = self.data_dir / "logs"
        self.processes.append(spawn(["coordinator"], self.settings, logs / "coordinator.log"))
        for n in range(self.workers):
            worker = self.settings.replace(hostname=f"worker{n + 1}@%h")
            self.processes.append(spawn(["worker"], worker, logs / f"worker{n + 1}.log"))
        client = redis.Redis.from_url(self.url)
        try:
            wait_for_executors(
                client, self.workers * len(self.settings.models), timeout_s, self.processes
            )
        except Exception:
            self.stop()
            raise
        finally:
            client.close()
        return self

    def stop(self) -> None:
        for process in reversed(self.processes):
            stop_process(process)
        self.processes.clear()
        if self.server:
            self.stack_file.unlink(missing_ok=True)
            self.server.stop()

    def exited(self) -> ProcessExited | None:
        """The first of the stack's processes that has exited, as an error, or None."""
        return next((e for p in self.processes if (e := p.exited())), None)

    def check(self) -> None:
        """Raise ProcessExited if one of the stack's processes has exited."""
        if error := self.exited():
            raise error

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
