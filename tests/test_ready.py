"""`tandem ready`: a container's readiness check passes only while the worker's
executors are registered and beating."""

from __future__ import annotations

import os
import signal

from helpers import tandem, wait_until


def ready(path, settings, env=None):
    env = {**(env or os.environ), "TANDEM_HEARTBEAT_TTL_S": str(settings.heartbeat_ttl_s)}
    return tandem("ready", "--file", str(path), env=env)


def test_ready_only_while_the_executors_are_registered_and_beating(processes, settings, tmp_path):
    path = tmp_path / "ready"
    before = ready(path, settings)
    assert before.returncode == 1
    assert before.stderr.strip() == (
        f"error: not ready: no ready file {path} (the worker's executors are not registered)"
    )
    worker = processes.worker("w1", ready_file=str(path))
    wait_until(lambda: ready(path, settings).returncode == 0, 10, "the worker to be ready")
    # A stopped worker removes its file; one killed leaves it to go stale.
    worker.send_signal(signal.SIGTERM)
    worker.wait(60)
    assert not path.exists() and ready(path, settings).returncode == 1
    worker = processes.worker("w2", ready_file=str(path))
    wait_until(lambda: ready(path, settings).returncode == 0, 10, "the second worker")
    worker.kill()
    worker.wait()
    stale = wait_until(
        lambda: (done := ready(path, settings)).returncode == 1 and done,
        10,
        "the ready file to go stale",
    )
    assert "old, over heartbeat_ttl_s" in stale.stderr


def test_ready_without_a_file_named_is_a_usage_error(tmp_path):
    done = tandem("ready", cwd=tmp_path)
    assert done.returncode == 2 and "TANDEM_READY_FILE" in done.stderr
