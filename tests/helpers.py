"""Waiting on conditions with deadlines, never on fixed sleeps."""

from __future__ import annotations

import ast
import gc
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import redis
from celery import Celery

from tandem.broker.settings import Settings, load_settings
from tandem.broker.state import ExecutorInfo
from tandem.broker.table import Table

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout_s: float = 30.0, what: str = "") -> T:
    """Poll `condition` until it returns something truthy; fail after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or condition}")
        time.sleep(0.01)  # polling interval of a condition wait, bounded by the deadline


def fast_settings(redis_url: str, **overrides) -> Settings:
    """Settings for a test Redis, with short heartbeats so dead executors expire fast."""
    return load_settings(
        env={},
        redis_url=redis_url,
        heartbeat_s=0.2,
        heartbeat_ttl_s=1.5,
        coordinator_interval_s=0.1,
        loglevel="INFO",
        **overrides,
    )


def executors_of(r: redis.Redis, worker: str) -> list[ExecutorInfo]:
    """The executors of the test worker started under `worker`."""
    return [e for e in Table(r).executors() if e.worker == f"{worker}@test"]


#: Every plain Celery app the tests made, so the session can quiet them before Redis stops.
PLAIN_APPS: list[Celery] = []


def plain_celery(settings) -> Celery:
    """A Celery client that knows only the task name, the kwargs and the queue name."""
    app = Celery("plain", broker=settings.redis_url, backend=settings.redis_url)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        # Results collected after the test Redis stopped must not retry for ever.
        result_backend_transport_options={"retry_policy": {"max_retries": 0}},
    )
    PLAIN_APPS.append(app)
    return app


def tandem(
    *args: str,
    redis_url: str | None = None,
    timeout: float = 60,
    cwd=None,
    env: dict[str, str] | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess:
    """Run the `tandem` command as a user would, with no TANDEM_* settings but the URL;
    input: what the user types."""
    env = {k: v for k, v in (env or os.environ).items() if not k.startswith("TANDEM_")}
    if redis_url:
        env["TANDEM_REDIS_URL"] = redis_url
    return subprocess.run(
        ["tandem", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        input=input,
    )


_HIDE = """\
import sys

HIDDEN = {hidden!r}


class Hide:
    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        return self.inner.find_spec(name, path, target)

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


sys.meta_path[:] = [Hide(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
"""


def hide_modules(folder: Path, *names: str) -> dict[str, str]:
    """An environment in which Python cannot find these top-level modules, as if the
    extra that brings them were not installed (a sitecustomize on PYTHONPATH)."""
    site = folder / "hide-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_HIDE.format(hidden=set(names)))
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def start_up(folder, *args: str) -> tuple[subprocess.Popen, str]:
    """`tandem up` in `folder`; returns the process and its banner line. It starts with
    SIGINT ignored, as a background job of a script does: a SIGINT stops it all the
    same (a terminal's Ctrl-C, with SIGINT as Python sets it, is test_stopping's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    up = subprocess.Popen(
        ["sh", "-c", 'trap "" INT; exec tandem up "$@"', "sh", *args],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def banner() -> str | None:
        line = up.stdout.readline()
        if not line and up.poll() is not None:
            raise AssertionError(f"tandem up exited with {up.returncode}")
        return line if "tandem up on" in line else None

    return up, wait_until(banner, 60, "the stack")


def parse_file(path: Path) -> ast.Module:
    """A Python file's syntax tree, parsed with the garbage collector off: a finalizer
    that a collection runs inside CPython 3.11's AST constructor (an earlier test's
    Celery result, say) breaks its recursion count ("AST constructor recursion depth
    mismatch")."""
    gc.disable()
    try:
        return ast.parse(path.read_text())
    finally:
        gc.enable()
