"""The coordinator: expires dead executors, reclaims their tasks, buries poison messages,
publishes state changes, and hands tasks that plain Celery clients pushed into L1 to
idle executors.

It is never on a routed task's path. If it is down, tasks still flow; dead executors
are reclaimed late, changes wait in the capped stream, and idle executors find L1
tasks themselves every poll_ms. Each tick costs Redis O(models) calls in one round trip,
and a sweep O(lapsed executors), whatever the size of the fleet.

One coordinator works per Redis: it holds a lease (keys.COORDINATOR) and renews it at
every sweep. Another one started on the same Redis says so and stands by, taking over
once the lease is free: at once when the first stops, within its time when it dies.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time

import redis

from tandem.broker import deadletter, message, results, tracing
from tandem.broker.connect import connect
from tandem.broker.errors import PoisonMessage
from tandem.broker.faults import Faults
from tandem.broker.retry import Backoff, retry
from tandem.broker.settings import Settings
from tandem.broker.table import Table
from tandem.coordinator.podcost import Cluster, PodCosts
from tandem.coordinator.scaling import Reading, Signal

log = logging.getLogger("tandem.coordinator")


#: How often the coordinator also reads the whole executor table, for executors that
#: no deadline records (registered by an older tandem) and ids left without a hash.
FULL_SWEEP_S = 60.0
#: How often it measures each model's demand and publishes its scaling signal.
SCALE_S = 0.25


class Coordinator:
    def __init__(self, settings: Settings, client: redis.Redis | None = None) -> None:
        self.settings = settings
        self.redis = client or connect(
            settings.redis_url, settings.sentinel_master, health_check_interval=10
        )
        self.table = Table(self.redis, settings, faults=Faults.from_env())
        self.reclaimed = 0
        self.relayed = 0
        self.buried = 0
        self.fed = 0
        self.failures = 0  # rounds that raised something other than a Redis error
        self._models: list[str] = []
        self._stop = threading.Event()
        #: This coordinator in the lease, and whether it holds the lease now (None: not
        #: asked yet).
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.leading: bool | None = None
        self._next_lease = 0.0
        self.signals: dict[str, Signal] = {}  # per model
        #: Where a buried task's span goes, if this process traces (broker/tracing.py).
        self.tracer = tracing.tracer("tandem-coordinator")
        #: Each worker pod's deletion cost, kept on Kubernetes when asked (podcost.py).
        self.pod_costs: PodCosts | None = None
        if settings.pod_deletion_cost:
            cluster = Cluster.in_cluster()
            if cluster is None:
                log.warning("pod_deletion_cost is on, but this is not a Kubernetes pod: ignored")
            else:
                self.pod_costs = PodCosts(cluster)

    def __repr__(self) -> str:
        return (
            f"<Coordinator reclaimed={self.reclaimed} relayed={self.relayed} buried={self.buried}>"
        )

    def run(self) -> None:
        """Loop until stop(): every feed_ms hand L1 tasks on and relay changes; every
        coordinator_interval_s sweep for dead executors, and once a minute all of them.
        A Redis error (a disconnect, READONLY, OOM ...) is retried with backoff. Any other
        error in a round is logged (its traceback once per kind) and the loop goes on
        after a backoff: nothing found in Redis ends the coordinator."""
        log.info("coordinator on %s", _safe(self.settings.redis_url))
        self._next_sweep = self._next_full = 0.0
        scaler = threading.Thread(target=self._scaler, name="scaling signal", daemon=True)
        scaler.start()
        failed = Backoff(first_s=self.settings.feed_ms / 1000, cap_s=5.0)
        seen: set[str] = set()
        while not self._stop.is_set():
            try:
                retry(self._lead, what="coordinator", stop=self._stop, backoff=Backoff(cap_s=5.0))
                if not self.leading:
                    self._stop.wait(self.settings.coordinator_interval_s)  # standing by
                    continue
                retry(self._round, what="coordinator", stop=self._stop, backoff=Backoff(cap_s=5.0))
            except Exception as e:  # noqa: BLE001 - a bug or a value no reader expected
                self.failures += 1
                kind = f"{type(e).__name__}: {e}"[:200]
                delay = failed.next()
                log.error(
                    "coordinator round failed (%s); going on in %.2fs", kind, delay,
                    exc_info=kind not in seen,
                )  # fmt: skip
                seen.add(kind)
                self._stop.wait(delay)
                continue
            failed.reset()
            self._stop.wait(self.settings.feed_ms / 1000)  # the feed's period
        scaler.join()

    def _scaler(self) -> None:
        """Measure and publish the scaling signal every SCALE_S while this coordinator
        leads, on a thread of its own: its reads grow with the executors, and the feed's
        period must not. A round waits at least as long as the last one took, so the
        signal has at most half of the coordinator's time."""
        failed = Backoff(first_s=SCALE_S, cap_s=5.0)
        waits = Backoff(cap_s=5.0)  # between tries after a Redis error
        seen: set[str] = set()
        pause = 0.0
        while not self._stop.wait(pause):
            if not self.leading:
                pause = SCALE_S
                continue
            try:
                took = retry(
                    self._timed_scale, what="scaling signal", stop=self._stop, backoff=waits
                )
            except Exception as e:  # noqa: BLE001 - a bug or a value no reader expected
                kind = f"{type(e).__name__}: {e}"[:200]
                log.error("scaling signal not measured (%s)", kind, exc_info=kind not in seen)
                seen.add(kind)
                pause = failed.next()
                continue
            failed.reset()
            pause = max(SCALE_S - (took or 0.0), took or 0.0)

    def _timed_scale(self) -> float:
        """scale(), and how long it took."""
        started = time.monotonic()
        self.scale()
        return time.monotonic() - started

    @property
    def lease_ms(self) -> int:
        """How long the lease lasts unless renewed: a heartbeat's time to death, and at
        least three sweeps."""
        s = self.settings
        return int(max(s.heartbeat_ttl_s, 3 * s.coordinator_interval_s) * 1000)

    def _lead(self) -> None:
        """Take or renew the lease, once a sweep; say so when this one starts or stops
        working."""
        now = time.monotonic()
        if now < self._next_lease:
            return
        holder = self.table.lease(self.holder, self.lease_ms)
        self._next_lease = now + self.settings.coordinator_interval_s
        leading = holder == self.holder
        if leading and self.leading is not True:
            log.info("coordinator %s holds the lease: it works on this Redis", self.holder)
        elif not leading and self.leading is not False:
            log.warning(
                "another coordinator, %s, works on this Redis (one per Redis): this one "
                "stands by and takes over when its lease of %d ms is free",
                holder,
                self.lease_ms,
            )
        self.leading = leading

    def _round(self) -> None:
        now = time.monotonic()
        if now >= self._next_sweep:
            full = now >= self._next_full
            self.sweep(full=full)
            self._next_sweep = now + self.settings.coordinator_interval_s
            if full:
                self._next_full = now + FULL_SWEEP_S
        self.feed()
        self.relay()

    def stop(self) -> None:
        self._stop.set()

    def release(self) -> None:
        """Give the lease up, so a coordinator standing by takes over at once."""
        if self.leading:
            try:
                self.table.lease(self.holder, 0)
            except redis.RedisError as e:
                log.warning("could not give up the lease (%s); it lapses by itself", e)
            self.leading = False

    def feed(self) -> int:
        """Hand each model's L1 tasks to its ready executors: one round trip."""
        fed = self.table.feed(self._models) if self._models else 0
        self.fed += fed
        return fed

    def sweep(self, *, full: bool = False) -> list[tuple[str, int]]:
        """Reclaim every executor whose heartbeat lapsed, counting a delivery for each task
        it held; then bury the poison messages. Returns (executor, tasks moved).
        Reads only the lapsed executors; `full` also reads every executor and set."""
        now_ms = self.table.now_ms()
        self._models = self.table.models()
        lapsed = self.table.lapsed(now_ms)
        if full:
            lapsed += [(e.id, e.model) for e in self.table.executors() if e.expires_ms <= now_ms]
        done = []
        for executor_id, model in dict(lapsed).items():
            if not model:  # its hash is gone
                self.table.forget_deadline(executor_id)
                continue
            moved = self.table.reclaim(executor_id, model, count=True)
            if moved >= 0:
                self.reclaimed += 1
                done.append((executor_id, moved))
                log.warning(
                    "executor %s missed its heartbeat; %d tasks back to L1 of %s",
                    executor_id,
                    moved,
                    model,
                )
        if full:
            self._reap_stray_ids()
        self.bury()
        return done

    def scale(self) -> dict[str, Reading]:
        """Measure each model's demand and capacity and publish how many executors it
        wants (coordinator/scaling.py): four round trips, however many models."""
        t_s, now_ms = time.monotonic(), self.table.now_ms()
        readings, published, everyone = {}, {}, []
        for model, demand in self.table.demands(self._models or self.table.models()).items():
            live = [e for e in demand.executors if e.expires_ms > now_ms]
            everyone += live
            counters = demand.counters
            waiting = (
                demand.l1_depth
                + demand.retry_depth
                + sum(e.l2_depth + e.inflight_depth for e in live)
            )
            # Tasks answered: `stored`, added with their results; the outcomes come a
            # little later (workers/returner.py), and alone from workers before `stored`.
            answered = max(
                counters.get("stored", 0.0),
                counters.get("outcome:SUCCESS", 0.0) + counters.get("outcome:FAILURE", 0.0),
            )
            arrived = (
                waiting
                + answered
                + sum(counters.get(field, 0.0) for field in ("shed:submit", "refused:full"))
            )
            signal = self.signals.get(model)
            if signal is None:  # the last known capacity, from before this coordinator
                known = demand.published.get("capacity_rps", 0.0)
                signal = self.signals[model] = Signal(self.settings, known)
            reading = signal.update(
                t_s,
                arrived=arrived,
                waiting=waiting,
                executors=live,
                slo_ms=demand.slo_ms,
                computed_ms=counters.get("compute_ms:sum", 0.0),
            )
            published[model] = {
                "offered_rps": round(reading.offered_rps, 3),
                "capacity_rps": round(reading.capacity_rps, 3),
                "needed": reading.needed,
                "wanted": reading.wanted,
                "running": reading.running,
                "busy": round(reading.busy, 3),
                "max": self.settings.scale_max_executors,
                "at_ms": now_ms,
            }
            readings[model] = reading
        self.table.publish_scales(published)
        if self.pod_costs is not None:
            self.pod_costs.offer(everyone)
        return readings

    def bury(self, limit: int = 100) -> int:
        """Quarantine each message that reached max_deliveries: a PoisonMessage FAILURE
        naming the executors it took down, and a dead letter. Returns how many."""
        buried = 0
        for raw, took in self.table.poison(limit):
            task = message.decode(raw, max_bytes=self.settings.max_message_bytes)
            error = PoisonMessage(
                f"quarantined after {len(took)} deliveries: the executors "
                f"{', '.join(dict.fromkeys(took))} died or crashed while holding it"
            )
            meta = results.failure(task.id, error) if task.id else ""
            record = deadletter.record(
                raw,
                f"PoisonMessage: {error}",
                task_id=task.id,
                model=task.model,
                executors=took,
            )
            if self.table.bury(raw, record, task.id, meta):
                buried += 1
                log.error("task %s: %s", task.id or "(no id)", error)
                if self.tracer is not None and task.id:
                    from tandem.broker.spans import buried as span

                    span(self.tracer, task, error, took)
        self.buried += buried
        return buried

    def _reap_stray_ids(self) -> None:
        """Drop ids left in an executors set whose hash is gone."""
        for model in self.table.models():
            for executor_id in self.table.executor_ids(model):
                if not self.table.exists(executor_id):
                    self.table.reclaim(executor_id, model, force=True, count=True)

    def relay(self, block_ms: int = 0) -> int:
        """Publish each new state change from the stream on the state channel, in order;
        returns how many. An entry the scripts could not have written is dropped."""
        entries = self.table.changes_since_relayed(block_ms)
        if not entries:
            return 0
        changes = []
        for entry_id, fields in entries:
            change = state_change(fields)
            if change is None:
                log.warning("dropped state change %s: not what the scripts write", entry_id)
                continue
            changes.append(json.dumps(change))
        self.table.relay(changes, entries[-1][0])
        self.relayed += len(changes)
        return len(changes)


def state_change(fields: dict) -> dict | None:
    """A stream entry as the state channel's JSON carries it; None unless its fields are
    UTF-8 and its `ms` an integer, as the scripts write them."""
    try:
        change = {k.decode(): v.decode() for k, v in fields.items()}
        change["ms"] = int(change.get("ms", 0))
    except (UnicodeDecodeError, ValueError):
        return None
    return change


def _safe(url: str) -> str:
    """The URL without its password, for logs."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.split('@', 1)[1]}"


def serve(settings: Settings) -> None:
    """Run a coordinator in the foreground until SIGINT or SIGTERM."""
    import signal

    coordinator = Coordinator(settings)
    if settings.metrics_port:
        from tandem.coordinator.exporter import serve as serve_metrics

        serve_metrics(coordinator.redis, settings.metrics_port)
        log.info("metrics on :%d/metrics", settings.metrics_port)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: coordinator.stop())
    coordinator.run()
    coordinator.release()
    log.info("coordinator stopped: %r", coordinator)
