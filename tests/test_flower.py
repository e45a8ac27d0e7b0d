"""Flower finds the stack as tandem's commands do: started as the README says in the
folder of a `tandem up`, or from anywhere with Celery's own --broker. With
FLOWER_BASIC_AUTH it asks for a login, as compose and Kubernetes document."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from helpers import start_up, wait_until
from tandem.server import free_port

LOGIN = "admin:s3cret"


def get(url: str, login: str | None = None):
    request = urllib.request.Request(url)
    if login:
        request.add_header("Authorization", "Basic " + base64.b64encode(login.encode()).decode())
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture
def up_folder(tmp_path):
    up, _ = start_up(tmp_path, "--workers", "2")
    yield tmp_path
    up.send_signal(signal.SIGTERM)
    up.wait(60)


def flower(cwd, *flags: str) -> tuple[subprocess.Popen, str]:
    """Flower as the README starts it, with no TANDEM_* setting and a login."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TANDEM_", "FLOWER_"))}
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tandem.broker.celeryapp", *flags, "flower"]
        + [f"--port={port}", "--address=127.0.0.1"],
        cwd=cwd,
        env={**env, "FLOWER_BASIC_AUTH": LOGIN},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return process, f"http://127.0.0.1:{port}"


def workers_seen(base: str, process: subprocess.Popen) -> set[str]:
    def seen() -> set[str] | None:
        if process.poll() is not None:
            raise AssertionError("flower exited")
        try:
            found = set(get(f"{base}/api/workers?refresh=1", LOGIN))
        except OSError:
            return None  # not listening yet
        return found if len(found) >= 2 else None

    return wait_until(seen, 60, "Flower to list the stack's workers")


def test_flower_in_an_up_folder_shows_the_stacks_workers_behind_a_login(up_folder):
    process, base = flower(up_folder)
    try:
        assert {w.partition("@")[0] for w in workers_seen(base, process)} == {
            "worker1",
            "worker2",
        }
        with pytest.raises(urllib.error.HTTPError) as refused:
            get(f"{base}/api/workers")
        assert refused.value.code == 401
    finally:
        process.terminate()
        process.wait(20)


def test_flower_anywhere_with_celerys_broker_flag(up_folder, tmp_path_factory):
    url = json.loads((up_folder / ".tandem" / "stack.json").read_text())["url"]
    process, base = flower(tmp_path_factory.mktemp("elsewhere"), f"--broker={url}")
    try:
        assert len(workers_seen(base, process)) == 2
    finally:
        process.terminate()
        process.wait(20)
