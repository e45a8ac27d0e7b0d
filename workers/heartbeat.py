"""Heartbeats: one thread per worker pushes back the deadline of every executor that
makes progress, and watches for hung computes."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tandem.broker.retry import Backoff, retry
from tandem.broker.table import Table
from tandem.workers.executor import Executor, Stuck

log = logging.getLogger("tandem.heartbeat")


class Heartbeat:
    """Beats for each executor that is alive and not stuck (see Executor.stuck).

    A stalled executor loses its heartbeat, so the coordinator hands its tasks on and it
    registers again when it wakes. A hung compute cannot be interrupted in-process, so
    `on_hung(executor)` is called: the worker exits and its supervisor restarts it.
    """

    def __init__(
        self,
        table: Table,
        executors: Sequence[Executor],
        *,
        interval_s: float,
        ttl_s: float,
        on_hung: Callable[[Executor], None] | None = None,
        ready_file: str = "",
    ) -> None:
        self.table = table
        self.executors = executors
        self.interval_s = interval_s
        self._backoff = Backoff(first_s=interval_s, cap_s=interval_s)  # a failed beat: next beat
        self.ttl_ms = int(ttl_s * 1000)
        self.on_hung = on_hung
        self.ready_file = Path(ready_file) if ready_file else None
        self.beats = 0
        self._stalled: set[str] = set()
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
        self._mark_ready(False)

    def beat(self) -> None:
        """Refresh every executor that is alive and making progress."""
        now = time.monotonic()
        live = []
        for executor in self.executors:
            stuck = executor.stuck(now)
            if stuck is Stuck.HUNG and self.on_hung is not None:
                self.on_hung(executor)
            if stuck and executor.id not in self._stalled:
                log.error(
                    "executor %s is %s (no progress for over %gs); its heartbeat stops",
                    executor.id,
                    stuck,
                    executor.settings.compute_timeout_s,
                )
            if stuck:
                self._stalled.add(executor.id)
            else:
                self._stalled.discard(executor.id)
            if executor.alive and not stuck:
                live.append(executor.id)
        gone = self.table.heartbeat(live, self.ttl_ms)
        self._mark_ready(len(live) == len(self.executors) and not gone)
        revocations = self.table.revocations() > 0
        for executor in self.executors:
            executor.revocations = revocations
        self.beats += 1

    def _mark_ready(self, ready: bool) -> None:
        """Touch the ready file after a beat of every executor; remove it otherwise."""
        if self.ready_file is None:
            return
        try:
            if ready:
                self.ready_file.write_text(f"{time.time():.3f}\n")
            else:
                self.ready_file.unlink(missing_ok=True)
        except OSError as e:
            log.error("cannot update the ready file %s: %s", self.ready_file, e)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                retry(self.beat, what="heartbeat", stop=self._stop, backoff=self._backoff)
            except Exception:  # noqa: BLE001 - the heartbeat thread must outlive any error
                log.exception("heartbeat failed")
