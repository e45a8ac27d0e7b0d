"""Metrics: executors record them in Redis per batch; the coordinator serves them to Prometheus.

Each model has one hash, keys.metrics(model), with counters that only grow:
``route:L1`` and ``route:L2`` (route.lua), and from each batch (complete.lua, with the
counters the executor's hooks give) ``outcome:SUCCESS|FAILURE``,
``failure:<reason>``, and per histogram ``<name>:<bucket>`` (non-cumulative),
``<name>:sum`` and ``<name>:count``.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator

import redis

from broker import keys
from broker.table import Table

HISTOGRAMS = {
    "batch_size": (1, 2, 4, 8, 16, 32, 64, 128, 256),
    "compute_ms": (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000),
    "device_ms": (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000),
    "queue_wait_ms": (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000),
    "latency_ms": (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000),
}
HELP = {
    "batch_size": "Tasks per computed batch.",
    "compute_ms": "Wall time of one batch's forward pass, in milliseconds.",
    "device_ms": "GPU time of one batch's forward pass (CUDA events), in milliseconds.",
    "queue_wait_ms": "Time from submit to the claim that put a task in a batch, in milliseconds.",
    "latency_ms": "Time from submit to the stored result, in milliseconds.",
}
STATES = ("IDLE", "WAITING", "WORKING", "STOPPING")
#: Counters of keys.STATS, kept by the scripts.
STATS = {
    "redelivered": "Tasks handed back from an executor's in-flight list.",
    "duplicates": "Second results of a redelivered task, dropped.",
    "poisoned": "Tasks that reached max_deliveries.",
    "dead_lettered": "Dead letters written (poison tasks and messages without an id).",
    "registrations": "Executor registrations: starts, restarts in place, re-registrations.",
}


def observe(counts: Counter, name: str, value: float) -> None:
    """Add one observation of histogram `name` to a batch's counters."""
    bounds = HISTOGRAMS[name]
    index = bisect.bisect_left(bounds, value)
    counts[f"{name}:{bounds[index] if index < len(bounds) else '+Inf'}"] += 1
    counts[f"{name}:sum"] += value
    counts[f"{name}:count"] += 1


class Collector:
    """A prometheus_client collector that reads tandem's Redis at each scrape."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        self.table = Table(client)

    def collect(self) -> Iterator:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        executors = self.table.executors()
        models = self.table.models()
        l1 = GaugeMetricFamily(
            "tandem_l1_depth", "Tasks waiting in the model's L1.", labels=["model"]
        )
        l2 = GaugeMetricFamily(
            "tandem_l2_depth", "Tasks in an executor's L2.", labels=["model", "executor"]
        )
        states = GaugeMetricFamily(
            "tandem_executors", "Executors by state.", labels=["model", "state"]
        )
        routes = CounterMetricFamily(
            "tandem_tasks_routed", "Tasks by route.", labels=["model", "route"]
        )
        outcomes = CounterMetricFamily(
            "tandem_tasks_finished", "Tasks by outcome.", labels=["model", "outcome"]
        )
        failures = CounterMetricFamily(
            "tandem_task_failures", "Failed tasks by reason.", labels=["model", "reason"]
        )
        retry = GaugeMetricFamily(
            "tandem_retry_depth",
            "Redelivered tasks waiting to be computed alone.",
            labels=["model"],
        )
        histograms = {
            name: HistogramMetricFamily(f"tandem_{name}", HELP[name], labels=["model"])
            for name in HISTOGRAMS
        }
        for model in models:
            l1.add_metric([model], self.table.l1_depth(model))
            retry.add_metric([model], self.redis.llen(keys.retry(model)))
            mine = [e for e in executors if e.model == model]
            for state in STATES:
                states.add_metric([model, state], sum(e.state == state for e in mine))
            for e in mine:
                l2.add_metric([model, e.id], e.l2_depth)
            fields = {
                k.decode(): float(v) for k, v in self.redis.hgetall(keys.metrics(model)).items()
            }
            for route in ("L1", "L2"):
                routes.add_metric([model, route], fields.get(f"route:{route}", 0.0))
            for outcome in ("SUCCESS", "FAILURE"):
                outcomes.add_metric([model, outcome], fields.get(f"outcome:{outcome}", 0.0))
            for field, value in fields.items():
                if field.startswith("failure:"):
                    failures.add_metric([model, field.partition(":")[2]], value)
            for name, bounds in HISTOGRAMS.items():
                running, buckets = 0.0, []
                for bound in (*bounds, "+Inf"):
                    running += fields.get(f"{name}:{bound}", 0.0)
                    buckets.append((str(bound), running))
                histograms[name].add_metric([model], buckets, fields.get(f"{name}:sum", 0.0))
        yield from (l1, l2, retry, states, routes, outcomes, failures, *histograms.values())
        yield from self._fleet(GaugeMetricFamily, CounterMetricFamily)

    def _fleet(self, gauge, counter) -> Iterator:
        """What tandem:stats counts over every model, and the dead-letter list's length."""
        stats = {k.decode(): int(v) for k, v in self.redis.hgetall(keys.STATS).items()}
        for name, text in STATS.items():
            yield counter(f"tandem_{name}", text, value=stats.get(name, 0))
        yield gauge(
            "tandem_dead_letters", "Dead letters kept now.", value=self.redis.llen(keys.DEAD)
        )


def serve(client: redis.Redis, port: int, address: str = "0.0.0.0") -> None:
    """Serve /metrics on a background thread."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    registry.register(Collector(client))
    start_http_server(port, addr=address, registry=registry)
