"""`tandem soak --faults sentinel`: steady load on a Redis under Sentinel while its
primary is killed (kill -9) again and again.

It runs a primary, a replica and three sentinels (tandem.server.SentinelGroup), a
coordinator and one worker on sim. A producer submits at a steady rate throughout. Each
round kills the current primary, waits until tasks are served again, then brings the
killed server back as a replica of the new primary. At the end it waits for every
accepted task's result and counts what was lost.
"""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tandem.broker import keys
from tandem.broker.connect import connect
from tandem.broker.errors import TandemError
from tandem.broker.retry import REDIS_ERRORS, retry
from tandem.broker.settings import Settings
from tandem.producers.client import Client, TandemResult
from tandem.server import RedisServer, SentinelGroup
from tandem.stack import spawn, stop_process, wait_for_executors
from tandem.tools import whereabouts
from tandem.tools.harness import drive

MODEL = "sim:1"


@dataclass
class FailoverReport:
    min_replicas: int
    down_after_ms: int
    heartbeat_ttl_s: float
    rounds: int = 0
    accepted: int = 0
    refused: int = 0
    completed: int = 0
    failed: int = 0
    lost: int = 0
    duplicates: int = 0
    served_again_s: list[float] = field(default_factory=list)
    #: Each lost task's whereabouts (tools/whereabouts.py), then the log lines naming it.
    lost_at: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        bound = 2 * self.down_after_ms / 1000 + self.heartbeat_ttl_s
        worst = max(self.served_again_s, default=0.0)
        return [
            f"primary killed          {self.rounds} times (min_replicas {self.min_replicas})",
            f"accepted                {self.accepted}",
            f"refused during a switch {self.refused}",
            f"completed               {self.completed}",
            f"failed                  {self.failed}",
            f"lost                    {self.lost}",
            f"duplicated (kept once)  {self.duplicates}",
            f"longest kill to served again {worst:.2f} s "
            f"(target {bound:.1f} s: 2 x down-after + heartbeat TTL)",
            *(f"lost: {line}" for line in self.lost_at),
        ]


class Producer(threading.Thread):
    """Submits one task every 1/rate s, open loop (at most HORIZON_S); keeps every
    accepted result, counts refusals, and the time each task was accepted."""

    HORIZON_S = 600

    def __init__(self, client: Client, rate: float) -> None:
        super().__init__(name="failover producer", daemon=True)
        self.client, self.rate = client, rate
        self.accepted: list[tuple[float, TandemResult]] = []
        self.refused = 0
        self.stop = threading.Event()

    def run(self) -> None:
        schedule = [(n + 1) / self.rate for n in range(int(self.rate * self.HORIZON_S))]
        drive(schedule, self._submit, lambda: None, stop=self.stop.is_set)

    def _submit(self, batch: list, at: float) -> tuple[list[str], int]:
        for inputs in batch:
            try:
                result = self.client.submit(MODEL, inputs)
            except TandemError:
                self.refused += 1
                continue
            self.accepted.append((time.monotonic(), result))
        return [], 0


def run_failover(
    settings: Settings, *, rounds: int = 3, rate: float = 100.0, min_replicas: int = 0
) -> FailoverReport:
    down_after_ms = 1000
    with tempfile.TemporaryDirectory(prefix="tandem-failover-") as folder:
        group = SentinelGroup(Path(folder) / "redis", down_after_ms=down_after_ms).start()
        settings = settings.replace(
            redis_url=group.url,
            sentinel_master=group.master,
            models=(MODEL,),
            sim_base_ms=1.0,
            sim_per_item_ms=0.05,
            heartbeat_s=0.2,
            heartbeat_ttl_s=1.5,
            min_replicas=min_replicas,
        )
        report = FailoverReport(min_replicas, down_after_ms, settings.heartbeat_ttl_s)
        admin = connect(group.url, group.master)
        logs = Path(folder) / "logs"
        processes = [
            spawn(["coordinator"], settings, logs / "coordinator.log"),
            spawn(["worker"], settings, logs / "worker.log"),
        ]
        client = Client(settings=settings)
        producer = Producer(client, rate)
        try:
            wait_for_executors(admin, 1, 120, processes)
            producer.start()
            for _ in range(rounds):
                time.sleep(3.0)  # steady load before each kill
                report.served_again_s.append(_kill_primary(group, producer))
                report.rounds += 1
            time.sleep(2.0)
            producer.stop.set()
            producer.join()
            _settle(report, producer, admin, [logs / "worker.log", logs / "coordinator.log"])
        finally:
            producer.stop.set()
            client.close()
            for process in processes:
                stop_process(process, 30)
            admin.close()
            group.stop()
        return report


def _kill_primary(group: SentinelGroup, producer: Producer) -> float:
    """Kill the primary; once Sentinel has promoted the replica, restart the killed server
    as a replica of the new primary. Returns the seconds from the kill until a task
    accepted after it has its result (inf if none within 60 s)."""
    port = group.primary()
    assert port is not None  # the sentinels name a primary before any kill
    old = group.server(port)
    killed = time.monotonic()
    old.kill()
    deadline = killed + 60
    while group.primary() in (None, old.port) and time.monotonic() < deadline:
        time.sleep(0.05)  # waiting for the promotion, bounded by the deadline
    replica = RedisServer(
        old.data_dir, port=old.port, args=("--replicaof", "127.0.0.1", str(group.primary()))
    )
    group.servers[group.servers.index(old)] = replica.start()
    while time.monotonic() < deadline:
        for accepted_at, result in list(producer.accepted):
            if accepted_at > killed and _ready(result):
                return time.monotonic() - killed
        time.sleep(0.02)  # polling the producer's results, bounded by the deadline
    return float("inf")


def _ready(result) -> bool:
    try:
        return result.ready()
    except REDIS_ERRORS:  # asked during the switch itself
        return False


def _settle(report: FailoverReport, producer: Producer, admin, logs: list[Path]) -> None:
    report.accepted = len(producer.accepted)
    report.refused = producer.refused
    deadline = time.monotonic() + 30  # for every result together
    lost = []
    for _, result in producer.accepted:
        try:
            result.get(timeout=max(0.05, deadline - time.monotonic()))
            report.completed += 1
        except TandemError:
            report.failed += 1
        except Exception:  # noqa: BLE001 - Celery's TimeoutError: no result, the task is lost
            lost.append(result.id)
    report.lost = len(lost)
    if lost:
        report.lost_at = retry(
            lambda: whereabouts.describe(admin, MODEL, lost, logs), what="failover: lost tasks"
        ) or ["(Redis did not answer)"]
    stats = retry(lambda: admin.hgetall(keys.STATS), what="failover: the stats") or {}
    report.duplicates = int(stats.get(b"duplicates", 0))
