"""A local stack for `tandem up`, `tandem demo` and tests: Redis, a coordinator, N workers.

Each part runs as its own process, started exactly as an operator would start it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import redis

from tandem.broker import lifeline
from tandem.broker.discovery import STACK_FILE, stack_url
from tandem.broker.errors import ProcessExited, TandemError
from tandem.broker.settings import Settings
from tandem.broker.table import Table
from tandem.server import RedisServer

log = logging.getLogger("tandem.stack")
P = TypeVar("P", bound=subprocess.Popen)


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
    pass_fds: tuple[int, ...] = (),
    stdin: int | None = None,
) -> Child:
    """Start `python -m MODULE ARGS` (by default `tandem ARGS`), its output going to log_path,
    in a session of its own (a terminal's Ctrl-C reaches only its owner). env: more
    variables for it; pass_fds: file descriptors it inherits (its lifeline, say); stdin:
    subprocess.PIPE to write to it."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **settings_env(settings), **(env or {})}
    with open(log_path, "ab") as log:
        return Child(
            [sys.executable, "-m", module, *args],
            name=name or log_path.stem,
            log_path=log_path,
            log_start=log.tell(),
            env=env,
            stdin=stdin,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=pass_fds,
        )


#: How long stop() gives each part of a stack, in turn: the workers together, the
#: coordinator, then Redis. A part still running past its share is killed; what it held
#: is in Redis. The README states their sum as the bound of a Ctrl-C on `tandem up`.
STOP_WORKERS_S = 20.0
STOP_COORDINATOR_S = 5.0
STOP_REDIS_S = 5.0
STOP_BOUND_S = STOP_WORKERS_S + STOP_COORDINATOR_S + STOP_REDIS_S


def stop_all(processes: Sequence[P], timeout_s: float) -> list[P]:
    """SIGTERM to each at once, then wait for them all within timeout_s; SIGKILL to those
    still running. Returns the ones killed."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    killed = []
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            killed.append(process)
    return killed


def stop_process(process: subprocess.Popen, timeout_s: float = 30.0) -> int:
    """SIGTERM, wait, then SIGKILL if it will not stop. Returns the exit code."""
    stop_all([process], timeout_s)
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
        now_ms = table.now_ms()  # an executor left by a killed stack is not ready
        ready = [e for e in table.executors() if e.state == "IDLE" and e.expires_ms > now_ms]
        if len(ready) >= count:
            return
        for process in processes:
            process.check()
        if time.monotonic() > deadline:
            raise TandemError(f"{len(ready)} of {count} executors came up in {timeout_s:g}s")
        time.sleep(0.05)  # polling a condition, bounded by the deadline


class Stack:
    """Redis (embedded unless settings name one), a coordinator and `workers` workers.

    Every process it starts sees it gone, however it ends (broker/lifeline.py): the
    coordinator and the workers stop as on SIGTERM, and the embedded Redis stops once
    they all have (shell/keeper.py). None of them is in the caller's process group, so
    a terminal's Ctrl-C reaches only the caller, which stops them in order (stop()).

    With `standby` N, N more worker processes wait as spares (`tandem worker --standby`):
    their imports done (torch, Celery: most of a worker's start that is not its models'
    load), no model loaded and no executor registered, so they hold no device memory and
    no task. add_worker() puts the oldest spare to work and starts another: a scale-out
    then waits for the models' load, not for a new process and its imports."""

    def __init__(
        self,
        settings: Settings,
        *,
        workers: int = 2,
        embedded: bool = True,
        data_dir: str | Path = STACK_FILE.parent,
        standby: int = 0,
    ) -> None:
        self.settings = settings
        self.workers = workers
        self.embedded = embedded
        self.data_dir = Path(data_dir)
        self.server: RedisServer | None = None
        #: The coordinator first, then the workers.
        self.processes: list[Child] = []
        #: Workers told to stop by a scale-in (retire()), until they have.
        self.retiring: list[Child] = []
        self.standby = standby
        self.spares: list[Child] = []  # standby workers, not yet serving, oldest first
        self._named = 0  # workers started so far: the next is worker{_named + 1}
        self._lifeline: lifeline.Pipe | None = None  # its children see this process gone
        self._holders: lifeline.Pipe | None = None  # Redis sees the whole stack gone

    @property
    def url(self) -> str:
        return self.settings.redis_url

    @property
    def stack_file(self) -> Path:
        """Where the URL is written for the commands that follow (discovery.STACK_FILE)."""
        return self.data_dir / "stack.json"

    def start(self, timeout_s: float = 60.0) -> Stack:
        if self.embedded and (running := stack_url(self.stack_file)):
            raise TandemError(
                f"a tandem up is already running in this folder, on {running}; "
                "stop it first, or point this command at it with --redis"
            )
        self._lifeline, self._holders = lifeline.Pipe(), lifeline.Pipe()
        try:
            self._start(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout_s: float) -> None:
        if self.embedded:
            assert self._holders is not None  # made by start()
            keeper_fd = self._holders.read_fd
            self.server = RedisServer(self.data_dir / "redis", keeper_fd=keeper_fd).start()
            self.settings = self.settings.replace(redis_url=self.server.url)
            self._write_stack_file()
        self.processes.append(self._spawn(["coordinator"], "coordinator"))
        for _ in range(self.workers):
            self.add_worker()
        client = redis.Redis.from_url(self.url)
        try:
            wait_for_executors(
                client, self.workers * len(self.settings.models), timeout_s, self.processes
            )
        finally:
            client.close()

    def _spawn(self, args: list[str], name: str, stdin: int | None = None, **changes) -> Child:
        """One process of the stack, with its lifelines: `tandem ARGS`, logging to NAME.log."""
        assert self._lifeline is not None and self._holders is not None  # made by start()
        settings = self.settings.replace(lifeline_fd=self._lifeline.read_fd, **changes)
        fds = (self._lifeline.read_fd, self._holders.write_fd)
        log_path = self.data_dir / "logs" / f"{name}.log"
        return spawn(args, settings, log_path, pass_fds=fds, stdin=stdin)

    def add_worker(self) -> Child:
        """Start one more worker (worker1, worker2, ...), the spare if there is one; it
        registers once it has loaded its models."""
        spare = next((p for p in self.spares if p.poll() is None), None)
        if spare is None:  # none, or exited: exited() names one that did
            process = self._new_worker()
        else:
            self.spares.remove(spare)
            process = spare
            assert process.stdin is not None  # a spare's
            try:
                process.stdin.write(b"go\n")
                process.stdin.close()
            except BrokenPipeError:  # it exited meanwhile: exited() names it
                process = self._new_worker()
        self.processes.append(process)
        while len(self.spares) < self.standby:
            self.spares.append(self._new_worker(standby=True))
        self._write_stack_file()
        return process

    def _new_worker(self, standby: bool = False) -> Child:
        self._named += 1
        name = f"worker{self._named}"
        if not standby:
            return self._spawn(["worker"], name, hostname=f"{name}@%h")
        return self._spawn(
            ["worker", "--standby"], name, stdin=subprocess.PIPE, hostname=f"{name}@%h"
        )

    def retire(self, process: Child) -> None:
        """Stop one worker warmly (a scale-in): SIGTERM, and no wait; it finishes the batch
        computing, hands back what it holds and deregisters on its own time."""
        self.processes.remove(process)
        self.retiring.append(process)
        process.send_signal(signal.SIGTERM)
        self._write_stack_file()

    @property
    def running_workers(self) -> list[Child]:
        return self.processes[1:]

    def _write_stack_file(self) -> None:
        """The URL and this process's pid, for the commands that follow (discovery.py),
        and the pids of the stack's processes, for an operator."""
        if not self.server:
            return  # not embedded: no stack file
        pids = {p.name: p.pid for p in (*self.processes, *self.retiring, *self.spares)}
        if self.server.process:
            pids["redis"] = self.server.process.pid
        self.stack_file.write_text(json.dumps({"url": self.url, "pid": os.getpid(), "pids": pids}))

    def stop(self) -> None:
        """Stop in order, each part within its share of STOP_BOUND_S: every worker at once
        (each finishes its batch in hand, stores its results, hands back what it holds
        and deregisters), then the coordinator, then Redis (it writes its AOF). One past
        its share is killed: what it held is in Redis, handed back once its heartbeat
        lapses. A KeyboardInterrupt meanwhile (a second Ctrl-C) kills what is left at
        once, and is raised again."""
        try:
            spares = self.spares
            for spare in spares:  # its stdin closed, it exits at once
                assert spare.stdin is not None
                spare.stdin.close()
            workers = self.running_workers + self.retiring + spares
            coordinator = self.processes[:1]
            for process in stop_all(workers, STOP_WORKERS_S) + stop_all(
                coordinator, STOP_COORDINATOR_S
            ):
                log.warning(
                    "%s did not stop within its share of %g s; killed (what it held goes "
                    "back to L1 once its heartbeat lapses)",
                    process.name,
                    STOP_BOUND_S,
                )
            if self.server:
                self.server.stop(STOP_REDIS_S)
        except KeyboardInterrupt:
            previous = _ignore_interrupts()
            try:
                self.kill()
            finally:
                _restore_interrupts(previous)
            raise
        finally:
            self._release()

    def kill(self) -> None:
        """Stop everything at once: SIGKILL to the coordinator and the workers (what they
        held is in Redis), then Redis stopped (SIGTERM: it writes its AOF at once)."""
        everything = (*self.processes, *self.retiring, *self.spares)
        for process in everything:
            if process.poll() is None:
                process.kill()
        for process in everything:
            process.wait()
        if self.server:
            self.server.stop(STOP_REDIS_S)
        self._release()

    def _release(self) -> None:
        """Forget the stopped processes; close this process's ends of the lifelines (any
        child still running then stops by itself), and drop the stack file."""
        self.processes.clear()
        self.retiring.clear()
        self.spares = []
        for pipe in (self._lifeline, self._holders):
            if pipe is not None:
                pipe.close()
        self._lifeline = self._holders = None
        if self.server:
            self.stack_file.unlink(missing_ok=True)

    def exited(self) -> ProcessExited | None:
        """The first of the stack's processes that has exited, as an error, or None. A
        retired worker that has stopped is forgotten."""
        for process in [p for p in self.retiring if p.poll() is not None]:
            self.retiring.remove(process)
            if process.returncode:
                log.warning("%s stopped with code %d", process.name, process.returncode)
            self._write_stack_file()
        return next((e for p in (*self.processes, *self.spares) if (e := p.exited())), None)

    def check(self) -> None:
        """Raise ProcessExited if one of the stack's processes has exited."""
        if error := self.exited():
            raise error

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _ignore_interrupts():
    """Ignore SIGINT (a third Ctrl-C) while the stack is killed; returns the old handler,
    or None off the main thread, where signal handlers cannot be set."""
    try:
        return signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:
        return None


def _restore_interrupts(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGINT, previous)
