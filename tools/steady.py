"""`tandem soak --faults none`: steady load for N minutes, watching for leaks.

It runs its own Redis, a coordinator and two workers serving sim and tiny, with results
and dead letters expiring after `ttl_s`. A producer sends open-loop Poisson arrivals
(harness.drive), every result received by harness.Recorder: plain tasks, tasks with
deadlines too short to meet (shed), bad inputs (FAILURE), revoked tasks, and now and
then a message with no usable id pushed straight into L1 (a dead letter). Every
`sample_s` it records the RSS of each worker, the coordinator and Redis, Redis's key
count and the sizes of the revoked set, the deadlines set and the dead letters. After
the load stops it waits for the results to expire and counts the keys again: they must
come back to what the stack held before the load (its executors, counters and latency
models), with no result left. Redis's own memory count (used_memory, and Lua's share) is
taken at the same two moments: RSS also keeps what the allocator has not given back.
"""

from __future__ import annotations

import random
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tandem.broker import keys
from tandem.broker.errors import TandemError
from tandem.broker.settings import Settings
from tandem.producers.client import Client
from tandem.server import RedisServer
from tandem.stack import Child, spawn, stop_process, wait_for_executors
from tandem.tools.harness import Recorder, arrivals, drive

MODELS = ("sim:1", "tiny:1")
#: The sizes each sample records, by name: Redis's key count and three sets that must
#: not grow with the tasks served.
SIZES = ("keys", "revoked", "deadlines", "dead_letters")


def rss_kb(pid: int) -> int:
    """The resident set of a process and its children, in KiB (Linux's /proc)."""
    total = 0
    for one in (pid, *_children(pid)):
        try:
            status = Path(f"/proc/{one}/status").read_text()
        except OSError:  # it exited meanwhile
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


def _children(pid: int) -> list[int]:
    try:
        found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    out = [int(child) for child in found]
    for child in list(out):
        out += _children(child)
    return out


@dataclass
class Sample:
    at_s: float
    rss_kb: dict[str, int]  # process name -> KiB
    sizes: dict[str, int]  # SIZES -> count


@dataclass
class SteadyReport:
    minutes: float
    ttl_s: int
    submitted: int = 0
    answered: int = 0  # results received, success or not
    unanswered: int = 0  # get() timed out: lost or late
    refused: int = 0  # refused at submit (Overloaded, QueueFull)
    revoked: int = 0
    junk: int = 0  # messages with no usable id pushed into L1
    keys_before: int = 0
    keys_after: int = 0
    results_left: int = 0
    memory_before: dict[str, int] = field(default_factory=dict)  # Redis's, in KiB
    memory_after: dict[str, int] = field(default_factory=dict)
    kinds_after: Counter = field(default_factory=Counter)  # key kind -> count, once expired
    samples: list[Sample] = field(default_factory=list)

    def lines(self) -> list[str]:
        first, last = self.samples[0], self.samples[-1]
        warm = self.warm()
        out = [
            f"steady load for {self.minutes:g} min; results and dead letters expire "
            f"after {self.ttl_s} s",
            f"submitted {self.submitted}, answered {self.answered}, unanswered "
            f"{self.unanswered}, refused at submit {self.refused}",
            f"revoked {self.revoked}, messages with no usable id {self.junk}",
            f"RSS (MiB) at {first.at_s:.0f} s, warm at {warm.at_s:.0f} s, and at the end "
            f"({last.at_s:.0f} s):",
        ]
        for name in first.rss_kb:
            mib = [s.rss_kb.get(name, 0) / 1024 for s in (first, warm, last)]
            out.append(f"  {name:12s} {mib[0]:8.1f} {mib[1]:8.1f} {mib[2]:8.1f}")
        out.append(f"sizes at {first.at_s:.0f} s, {warm.at_s:.0f} s and {last.at_s:.0f} s:")
        for name in SIZES:
            counts = [s.sizes[name] for s in (first, warm, last)]
            out.append(f"  {name:12s} {counts[0]:8d} {counts[1]:8d} {counts[2]:8d}")
        out.append(
            f"keys before the load {self.keys_before}, once results expired "
            f"{self.keys_after} ({self.results_left} results left):"
        )
        for kind, count in sorted(self.kinds_after.items()):
            out.append(f"  {kind:40s} {count}")
        out.append("Redis's memory (KiB) before the load and once results expired:")
        for name in self.memory_before:
            before, after = self.memory_before[name], self.memory_after.get(name, 0)
            out.append(f"  {name:16s} {before:8d} {after:8d}")
        return out

    def warm(self) -> Sample:
        """The first sample taken a tenth of the run in (at most a minute): caches,
        pools and buffers have filled by then, so growth after it is what leaks."""
        after = min(60.0, self.minutes * 6)
        return next((s for s in self.samples if s.at_s >= after), self.samples[-1])

    @property
    def per_task_keys(self) -> int:
        """Keys left of a kind made per task (results, delivery records) once expired."""
        per_task = (f"{keys.RESULT_PREFIX}*", f"{keys.DELIVERIES_PREFIX}*")
        return sum(self.kinds_after[kind] for kind in per_task)

    @property
    def leaked(self) -> bool:
        return self.per_task_keys > 0 or self.unanswered > 0


def kind(key: str) -> str:
    """A key's kind: its name with a task's, executor's or model's id made `*`."""
    if key.startswith(keys.RESULT_PREFIX):
        return f"{keys.RESULT_PREFIX}*"
    if key.startswith(keys.DELIVERIES_PREFIX):
        return f"{keys.DELIVERIES_PREFIX}*"
    parts = key.split(":")
    return ":".join(parts[:2]) + ":*" if len(parts) > 2 else key


class Steady:
    def __init__(
        self, settings: Settings, seconds: float, folder: Path, *, rate: float, ttl_s: int
    ) -> None:
        self.seconds, self.rate, self.folder = seconds, rate, folder
        self.server = RedisServer(folder / "redis").start()
        self.settings = settings.replace(
            redis_url=self.server.url,
            models=MODELS,
            result_expires_s=ttl_s,
            dead_letter_ttl_s=ttl_s,
        )
        self.redis = redis.Redis.from_url(self.server.url)
        self.report = SteadyReport(minutes=seconds / 60, ttl_s=ttl_s)
        self.processes: dict[str, Child] = {}
        self._stop = threading.Event()

    def run(self, sample_s: float) -> SteadyReport:
        logs = self.folder / "logs"
        self.processes["coordinator"] = spawn(["coordinator"], self.settings, logs / "coord.log")
        for n in range(2):
            worker = self.settings.replace(hostname=f"steady{n}@soak")
            self.processes[f"worker {n}"] = spawn(["worker"], worker, logs / f"w{n}.log")
        try:
            wait_for_executors(self.redis, 2 * len(MODELS), 120, list(self.processes.values()))
            self.report.keys_before = self.redis.dbsize()
            self.report.memory_before = self._memory()
            self._load(sample_s)
            self._expire()
        finally:
            for process in self.processes.values():
                stop_process(process)
            self.server.stop()
        return self.report

    def _load(self, sample_s: float) -> None:
        recorder = Recorder(self.server.url)
        sent: list[str] = []
        threads = [
            threading.Thread(target=self._produce, args=(sent,)),
            threading.Thread(target=self._junk),
        ]
        for thread in threads:
            thread.start()
        start = time.monotonic()
        try:
            while True:
                self.report.samples.append(self._sample(time.monotonic() - start))
                left = self.seconds - (time.monotonic() - start)
                if left <= 0 or self._stop.wait(min(sample_s, left)):
                    break
            self.report.samples.append(self._sample(time.monotonic() - start))
        finally:
            self._stop.set()
            for thread in threads:
                thread.join()
            # Every task accepted is answered (a result, a FAILURE or REVOKED) within 30 s.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                arrived = recorder.collect_so_far()
                if all(t in arrived for t in sent):
                    break
                self._stop.wait(0.2)  # polling the recorder, bounded by the deadline
            arrived = recorder.collect()
        report = self.report
        report.submitted = len(sent)
        report.answered = sum(1 for t in sent if t in arrived)
        report.unanswered = report.submitted - report.answered

    def _produce(self, sent: list[str]) -> None:
        """Open-loop Poisson arrivals of a mix: plain tasks, tiny's, deadlines too short to
        be met (shed, or refused), bad inputs and revoked tasks."""
        rng = random.Random(1)
        report = self.report
        with Client(settings=self.settings) as client:

            def submit(batch: list[str], at: float) -> tuple[list[str], int]:
                ids, refused = [], 0
                for kind in batch:
                    try:
                        result = self._submit(client, kind, rng)
                    except TandemError:  # Overloaded, QueueFull: a fast "no"
                        refused += 1
                        continue
                    if kind == "revoke":
                        client.revoke(result.id)
                        report.revoked += 1
                    ids.append(result.id)
                sent.extend(ids)
                report.refused += refused
                return ids, refused

            schedule = arrivals(self.rate, self.seconds, 1)
            mix = (["ok", "tiny", "deadline", "bad", "revoke"], [80, 10, 4, 3, 3])
            kinds = rng.choices(*mix, k=len(schedule))
            drive(schedule, submit, lambda: None, kinds.__getitem__, stop=self._stop.is_set)

    @staticmethod
    def _submit(client: Client, kind: str, rng: random.Random):
        if kind == "tiny":
            return client.submit("tiny:1", [rng.random() for _ in range(8)])
        if kind == "deadline":  # too short to be met: shed, or refused
            return client.submit("sim:1", [1.0], deadline_s=0.0005)
        if kind == "bad":
            return client.submit("tiny:1", [1.0, 2.0])
        return client.submit("sim:1", [rng.random()])

    def _junk(self) -> None:
        """Every second, a message with no usable id into sim's L1: a dead letter each."""
        while not self._stop.wait(1.0):  # the junk's own pace, not synchronisation
            self.redis.lpush(keys.l1("sim:1"), b'{"headers": {}, "body": "e30="}')
            self.report.junk += 1

    def _sample(self, at_s: float) -> Sample:
        rss = {name: rss_kb(process.pid) for name, process in self.processes.items()}
        rss["redis"] = int(self.redis.info("memory")["used_memory_rss"]) // 1024
        sizes = {
            "keys": self.redis.dbsize(),
            "revoked": self.redis.zcard(keys.REVOKED),
            "deadlines": self.redis.zcard(keys.DEADLINES),
            "dead_letters": self.redis.llen(keys.DEAD),
        }
        return Sample(at_s, rss, sizes)

    def _expire(self) -> None:
        """Wait for every result to expire (TTL plus Redis's active expiry), then count the
        keys left by kind."""
        deadline = time.monotonic() + self.settings.result_expires_s + 60
        while time.monotonic() < deadline:
            left = self._results_left()
            if left == 0:
                break
            time.sleep(1.0)  # polling Redis's expiry, bounded by the deadline
        self.report.results_left = self._results_left()
        self.report.keys_after = self.redis.dbsize()
        self.report.memory_after = self._memory()
        self.report.kinds_after = Counter(
            kind(key.decode(errors="replace")) for key in self.redis.scan_iter(count=1000)
        )

    def _memory(self) -> dict[str, int]:
        """Redis's own count of its memory, and what its allocator holds, in KiB."""
        info = self.redis.info("memory")
        names = ("used_memory", "used_memory_lua", "used_memory_rss")
        return {name: int(info[name]) // 1024 for name in names}

    def _results_left(self) -> int:
        return sum(1 for _ in self.redis.scan_iter(f"{keys.RESULT_PREFIX}*", count=1000))


def run_steady(
    settings: Settings, minutes: float, *, rate: float = 100.0, ttl_s: int = 60
) -> SteadyReport:
    sample_s = max(1.0, minutes * 60 / 30)
    with tempfile.TemporaryDirectory(prefix="tandem-steady-") as folder:
        return Steady(settings, minutes * 60, Path(folder), rate=rate, ttl_s=ttl_s).run(sample_s)
