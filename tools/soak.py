"""`tandem soak`: mixed load for N minutes with worker kills, poison tasks and one Redis
restart.

It runs its own Redis (AOF, appendfsync always), a coordinator and 3 workers serving
sim, tiny and a saboteur model (tools/chaos.py). Every 60 s (and at the start) it
submits one task that kills its worker and one that hangs it (compute_timeout_s 2 s); a
supervisor restarts any worker that exits. At the end it prints what happened to every
task whose submit returned.
"""

from __future__ import annotations

import json
import random
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tandem.broker import deadletter, keys, message
from tandem.broker.errors import BrokerUnavailable, Overloaded, QueueFull
from tandem.broker.settings import Settings
from tandem.broker.table import Table
from tandem.producers.client import Client
from tandem.server import RedisServer
from tandem.stack import Child, spawn, stop_process, wait_for_executors
from tandem.tools import chaos
from tandem.tools.harness import arrivals, drive

MODELS = ("sim:1", "tiny:1", "saboteur:1")
POISON_EVERY_S = 60.0


@dataclass
class Report:
    submitted: int = 0
    refused: int = 0
    overloaded: int = 0
    completed: int = 0
    failed: Counter = field(default_factory=Counter)
    lost: int = 0
    duplicates: int = 0
    redelivered: int = 0
    kills: int = 0
    exits: Counter = field(default_factory=Counter)
    quarantined: int = 0
    quarantined_other: int = 0
    poison_sent: int = 0
    redis_restarts: int = 0
    recoveries_s: list[float] = field(default_factory=list)
    served_again_s: list[float] = field(default_factory=list)

    def lines(self) -> list[str]:
        worst = max(self.recoveries_s, default=0.0)
        served = max(self.served_again_s, default=0.0)
        failed = ", ".join(f"{k} {v}" for k, v in sorted(self.failed.items())) or "none"
        exits = ", ".join(f"code {k}: {v}" for k, v in sorted(self.exits.items())) or "none"
        return [
            f"submitted (accepted)   {self.submitted}",
            f"refused while down     {self.refused}",
            f"shed at submit (Overloaded) {self.overloaded}",
            f"completed              {self.completed}",
            f"failed, by reason      {failed}",
            f"lost                   {self.lost}",
            f"duplicated (kept once) {self.duplicates}",
            f"redelivered            {self.redelivered}",
            f"worker kills survived  {self.kills}",
            f"poison tasks sent      {self.poison_sent} (quarantined {self.quarantined})",
            f"quarantined, not poison {self.quarantined_other}",
            f"workers that exited    {exits} (restarted)",
            f"Redis restarts         {self.redis_restarts}",
            f"max recovery (kill to reclaim) {worst:.2f} s over {len(self.recoveries_s)} kills",
            f"max recovery (kill to its tasks served again) {served:.2f} s over "
            f"{len(self.served_again_s)} kills of workers holding tasks",
        ]


class Soak:
    def __init__(
        self,
        settings: Settings,
        seconds: float,
        kill_every_s: float,
        folder: Path,
        rate: float = 150.0,
    ) -> None:
        self.seconds, self.kill_every_s, self.rate = seconds, kill_every_s, rate
        self.folder = folder
        self.server = RedisServer(folder / "redis", appendfsync="always").start()
        self.settings = settings.replace(
            redis_url=self.server.url,
            models=MODELS,
            repository=str(chaos.write_repository(folder / "repo")),
            heartbeat_ttl_s=2.0,
            heartbeat_s=0.5,
            coordinator_interval_s=0.2,
            compute_timeout_s=2.0,
        )
        self.redis = redis.Redis.from_url(self.server.url)
        self.report = Report()
        self.accepted: dict[str, str] = {}  # task id -> "ok" | "bad" | "deadline"
        self.workers: dict[str, Child] = {}
        self.coordinator = spawn(["coordinator"], self.settings, folder / "logs" / "coord.log")
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the chaos and supervisor threads both start workers
        self._n = 0

    def start_worker(self) -> None:
        with self._lock:
            name = f"soak{self._n}"
            self._n += 1
        worker = self.settings.replace(hostname=f"{name}@soak")
        self.workers[worker.hostname] = spawn(
            ["worker"], worker, self.folder / "logs" / f"{name}.log"
        )

    def supervise(self) -> None:
        """Restart each worker that exits by itself, as compose or Kubernetes would."""
        while not self._stop.wait(0.2):  # a supervisor's polling interval
            for name, process in list(self.workers.items()):
                if process.poll() is not None and self.workers.pop(name, None) is not None:
                    self.report.exits[process.returncode] += 1
                    self.start_worker()

    def produce(self) -> None:
        """Open-loop Poisson arrivals of a mix, a pair of poison tasks every
        POISON_EVERY_S; refusals while Redis is down are counted, not retried."""
        rng = random.Random(7)
        client = Client(settings=self.settings)
        next_poison = [time.monotonic()]

        def submit(batch: list[str], at: float) -> tuple[list[str], int]:
            for kind in batch:
                if time.monotonic() >= next_poison[0]:
                    kind = "poison"
                    next_poison[0] += POISON_EVERY_S
                try:
                    self._submit(client, kind, rng)
                except (BrokerUnavailable, QueueFull):
                    self.report.refused += 1
                except Overloaded:  # a deadline the predicted wait passes: never queued
                    self.report.overloaded += 1
            return [], 0

        schedule = arrivals(self.rate, self.seconds, 7)
        kinds = rng.choices(["ok", "bad", "deadline"], weights=[90, 5, 5], k=len(schedule))
        drive(schedule, submit, lambda: None, kinds.__getitem__, stop=self._stop.is_set)
        client.close()

    def _submit(self, client: Client, kind: str, rng: random.Random) -> None:
        if kind == "poison":
            for marker in (chaos.KILL, chaos.HANG):
                self.accepted[client.submit("saboteur:1", [marker, 0, 0, 0]).id] = kind
                self.report.poison_sent += 1
            return
        if kind == "bad":
            result = client.submit("tiny:1", [1.0, 2.0])
        elif kind == "deadline":
            result = client.submit("sim:1", ["d"], deadline_s=0.05)
        elif rng.random() < 0.1:
            result = client.submit("saboteur:1", [rng.random() for _ in range(4)])
        elif rng.random() < 0.5:
            result = client.submit("tiny:1", [rng.random() for _ in range(8)])
        else:
            result = client.submit("sim:1", [rng.random()])
        self.accepted[result.id] = kind

    def chaos(self) -> None:
        """A kill every kill_every_s, and one Redis restart half-way. A kill that found no
        worker running (all of them restarting, on a slow host) is tried again at once,
        so that kills happen however long workers take to start."""
        rng = random.Random(11)
        restarted = False
        start = time.monotonic()
        pause = self.kill_every_s
        while not self._stop.wait(pause):
            if not restarted and time.monotonic() - start > self.seconds / 2:
                self.restart_redis()
                restarted = True
                pause = self.kill_every_s
                continue
            pause = self.kill_every_s if self.kill_one(rng) else 0.0

    def kill_one(self, rng: random.Random) -> bool:
        """Kill a running worker, and time its recovery; False if none was running."""
        victim = self._victim(rng)
        if victim is None:
            return False
        process = self.workers.pop(victim.worker, None)
        if process is None:  # the supervisor saw it exit first
            return False
        held = self._held(victim.id)
        process.kill()
        killed = time.monotonic()
        self.report.kills += 1
        self.start_worker()
        deadline = killed + 60
        reclaimed = False
        while time.monotonic() < deadline:  # measuring the recovery, bounded
            if not reclaimed and not self.redis.exists(keys.executor(victim.id)):
                self.report.recoveries_s.append(time.monotonic() - killed)
                reclaimed = True
            if reclaimed and not held:
                return True
            if reclaimed and self._count([keys.result(t) for t in held]) == len(held):
                self.report.served_again_s.append(time.monotonic() - killed)
                return True
            time.sleep(0.02)
        return True

    def _victim(self, rng: random.Random):
        """An executor of a worker this soak runs now (not one a poison task took down,
        whose executors wait for the coordinator): a busy one if any (its in-flight tasks
        must come back), else any. While every worker is still starting (after poison
        tasks or the Redis restart), wait for one, up to kill_every_s, so kills happen."""
        deadline = time.monotonic() + self.kill_every_s
        while not self._stop.is_set():
            try:
                executors = Table(self.redis).executors()
            except redis.RedisError:
                executors = []
            running = [e for e in executors if e.worker in self.workers]
            busy = [e for e in running if e.inflight_depth] or running
            if busy:
                return rng.choice(busy)
            if time.monotonic() > deadline:
                return None
            self._stop.wait(0.1)  # polling for a registered worker, bounded by the deadline
        return None

    def _held(self, executor_id: str) -> list[str]:
        """Ids of the good tasks in an executor's L2 and in-flight lists."""
        raws: list[bytes] = self.redis.lrange(keys.inflight(executor_id), 0, -1)  # type: ignore[assignment]
        raws += self.redis.lrange(keys.l2(executor_id), 0, -1)  # type: ignore[arg-type]
        ids = [message.decode(raw, max_bytes=self.settings.max_message_bytes).id for raw in raws]
        return [i for i in ids if i is not None and self.accepted.get(i) == "ok"]

    def restart_redis(self) -> None:
        self.server.kill()
        time.sleep(2.5)  # an outage longer than the heartbeat TTL, on purpose
        self.server.start()
        self.report.redis_restarts += 1

    def run(self) -> Report:
        for _ in range(3):
            self.start_worker()
        wait_for_executors(self.redis, 3 * len(MODELS), 120, list(self.workers.values()))
        threads = [
            threading.Thread(target=self.produce),
            threading.Thread(target=self.chaos),
            threading.Thread(target=self.supervise),
        ]
        for thread in threads:
            thread.start()
        time.sleep(self.seconds)  # the soak's duration
        self._stop.set()
        for thread in threads:
            thread.join()
        self.drain()
        return self.report

    def drain(self, timeout_s: float = 180.0) -> None:
        ids = list(self.accepted)
        result_keys = [keys.result(t) for t in ids]
        deadline = time.monotonic() + timeout_s
        supervisor = threading.Thread(target=self.supervise)
        self._stop.clear()  # poison tasks still take workers down while draining
        supervisor.start()
        while time.monotonic() < deadline and self._count(result_keys) < len(ids):
            time.sleep(0.2)  # waiting for the backlog, bounded
        self._stop.set()
        supervisor.join()
        for process in self.workers.values():
            stop_process(process)
        stop_process(self.coordinator)
        queued = self.redis.llen(keys.POISON) + sum(
            self.redis.llen(k) for m in MODELS for k in keys.claim_keys(m)
        )
        report = self.report
        report.submitted = len(ids)
        for raw in self._values(result_keys):
            if raw is None:
                continue
            meta = json.loads(raw)
            if meta["status"] == "SUCCESS":
                report.completed += 1
            else:
                report.failed[meta["result"]["exc_type"]] += 1
        done = report.completed + sum(report.failed.values())
        report.lost = len(ids) - done - queued
        stats = self.redis.hgetall(keys.STATS)
        report.duplicates = int(stats.get(b"duplicates", 0))
        report.redelivered = int(stats.get(b"redelivered", 0))
        for letter in deadletter.read(self.redis, 10_000):
            if letter.reason.startswith("PoisonMessage"):
                if self.accepted.get(letter.id or "") == "poison":
                    report.quarantined += 1
                else:  # its workers were killed under it max_deliveries times
                    report.quarantined_other += 1
        self.server.stop()

    def _count(self, result_keys: list[str]) -> int:
        return sum(
            self.redis.exists(*result_keys[i : i + 1000]) for i in range(0, len(result_keys), 1000)
        )

    def _values(self, result_keys: list[str]) -> list:
        out = []
        for i in range(0, len(result_keys), 1000):
            out += self.redis.mget(result_keys[i : i + 1000])
        return out


def run_soak(settings: Settings, minutes: float, kill_every_s: float) -> Report:
    with tempfile.TemporaryDirectory(prefix="tandem-soak-") as folder:
        return Soak(settings, minutes * 60, kill_every_s, Path(folder)).run()
