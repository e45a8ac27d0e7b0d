"""Heartbeats: one thread per worker pushes back every live executor's deadline."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import redis

from broker.table import Table
from workers.executor import Executor

log = logging.getLogger("tandem.heartbeat")


class Heartbeat:
    def __init__(
        self, table: Table, executors: Sequence[Executor], *, interval_s: float, ttl_s: float
    ) -> None:
        self.table = table
        self.executors = executors
        self.interval_s = interval_s
        self.ttl_ms = int(ttl_s * 1000)
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tandem heartbeat", daemon=True)

    def __repr__(self) -> str:
        return f"<Heartbeat beats={self.beats} interval_s={self.interval_s}>"

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def beat(self) -> None:
        """Refresh every executor whose thread is alive; a crashed one is left to expire."""
        self.table.heartbeat([e.id for e in self.executors if e.alive], self.ttl_ms)
        self.beats += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except redis.RedisError as e:
                log.warning("heartbeat failed: %s: %s", type(e).__name__, e)
            except Exception:  # noqa: BLE001 - the heartbeat thread must outlive any error
                log.exception("heartbeat failed")
