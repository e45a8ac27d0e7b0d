"""`tandem up --min-workers N --max-workers M`: the local stack's workers follow the
coordinator's scaling signal (coordinator/scaling.py), as KEDA makes a Deployment follow
it on Kubernetes.

Every worker serves every model of the stack, one executor each, so the stack wants as
many workers as the model that wants the most executors. A worker started counts at
once, while it still loads its models, so a slow start is not answered with more
starts. A scale-in stops the idlest worker (the fewest tasks held, IDLE first), warmly:
it finishes the batch computing and hands back the rest, so nothing is lost.
"""

from __future__ import annotations

import logging
import math

import redis

from tandem.broker.table import Table
from tandem.stack import Child, Stack

log = logging.getLogger("tandem.autoscale")


class LocalScaler:
    def __init__(
        self, stack: Stack, client: redis.Redis, *, min_workers: int, max_workers: int
    ) -> None:
        self.stack = stack
        self.table = Table(client)
        self.min_workers, self.max_workers = min_workers, max_workers

    def target(self) -> int:
        """Workers the signal wants now, within min and max; the current count while no
        coordinator has published one."""
        per_worker = self.stack.settings.executors_per_model
        published = [self.table.scale(m).get("wanted") for m in self.stack.settings.models]
        if all(w is None for w in published):
            wanted = len(self.stack.running_workers)
        else:
            wanted = max(math.ceil((w or 0) / per_worker) for w in published)
        return min(max(wanted, self.min_workers), self.max_workers)

    def step(self) -> int:
        """Start or stop workers to meet the target; returns it. Without Redis, nothing
        changes."""
        running = self.stack.running_workers
        try:
            target = self.target()
        except redis.RedisError as e:
            log.warning("cannot read the scaling signal (%s); keeping %d workers", e, len(running))
            return len(running)
        for _ in range(target - len(running)):
            started = self.stack.add_worker()
            log.info("scaling out to %d workers: started %s", target, started.name)
        for _ in range(len(running) - target):
            idlest = self.idlest()
            self.stack.retire(idlest)
            log.info("scaling in to %d workers: stopping %s, the idlest", target, idlest.name)
        return target

    def idlest(self) -> Child:
        """The running worker holding the fewest tasks (L2 and in-flight), IDLE before
        busy; among equals, the newest (the one whose model is least warm)."""
        held: dict[str, tuple[int, int]] = {}
        try:
            executors = self.table.executors()
        except redis.RedisError:
            executors = []  # unknown: the newest goes
        for e in executors:
            name = e.worker.partition("@")[0]
            tasks, busy = held.get(name, (0, 0))
            held[name] = (tasks + e.l2_depth + e.inflight_depth, busy + (e.state != "IDLE"))
        workers = self.stack.running_workers
        return min(
            reversed(workers),  # min keeps the first of equals: the newest
            key=lambda p: held.get(p.name, (0, 0))[::-1],
        )
