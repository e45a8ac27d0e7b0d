"""Prometheus /metrics for the coordinator: reads tandem's Redis at each scrape, in the
schema of tandem.broker.metrics."""

from __future__ import annotations

from collections.abc import Iterator

import redis

from tandem.broker.metrics import HELP, HISTOGRAMS, STATS
from tandem.broker.state import State
from tandem.broker.table import Table


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
        shed = CounterMetricFamily(
            "tandem_tasks_shed",
            "Tasks refused for their deadlines: at submit (Overloaded, never enqueued) or "
            "at claim (DeadlineExceeded, never computed).",
            labels=["model", "stage"],
        )
        goodput = CounterMetricFamily(
            "tandem_tasks_goodput",
            "Successes stored by their deadline (or with none): the answers still wanted.",
            labels=["model"],
        )
        late = CounterMetricFamily(
            "tandem_tasks_late",
            "Successes stored after their deadline: computed for nobody.",
            labels=["model"],
        )
        speed = {
            name: GaugeMetricFamily(f"tandem_{name}", text, labels=["model"])
            for name, text in (
                ("capacity", "Tasks/s the live executors serve at full batches (measured)."),
                (
                    "predicted_wait_ms",
                    "Predicted ms from a submit of priority 0 into L1 to its result.",
                ),
            )
        }
        fit = {
            name: GaugeMetricFamily(f"tandem_{name}", text, labels=["model", "executor"])
            for name, text in (
                ("compute_base_ms", "An executor's fitted compute ms of a batch, fixed part."),
                ("compute_per_item_ms", "An executor's fitted compute ms per task of a batch."),
                ("compute_margin_ms", "How much slower than the fit a compute may be (tail)."),
            )
        }
        scale = {
            name: GaugeMetricFamily(f"tandem_{name}", text, labels=["model"])
            for name, text in (
                (
                    "executors_wanted",
                    "Executors the model wants: the offered rate with headroom over one "
                    "executor's capacity at the SLO; rises at once, falls after a window.",
                ),
                ("executors_needed", "Executors the demand needs now, before window and bounds."),
                ("executors_max", "The most executors the signal asks for."),
                (
                    "offered_rate",
                    "Tasks/s offered: completed, refused at submit and the growth of what waits.",
                ),
                (
                    "capacity_per_executor",
                    "Tasks/s one executor computes at the largest batch that meets the SLO.",
                ),
                (
                    "device_busy_ratio",
                    "Share of time the live executors' devices ran forward passes (10 s).",
                ),
            )
        }
        fields_of_scale = {
            "executors_wanted": "wanted",
            "executors_needed": "needed",
            "executors_max": "max",
            "offered_rate": "offered_rps",
            "capacity_per_executor": "capacity_rps",
            "device_busy_ratio": "busy",
        }
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
            retry.add_metric([model], self.table.retry_depth(model))
            mine = [e for e in executors if e.model == model]
            for state in State:
                states.add_metric([model, state.value], sum(e.state == state for e in mine))
            for e in mine:
                l2.add_metric([model, e.id], e.l2_depth)
                fit["compute_base_ms"].add_metric([model, e.id], e.base_ms)
                fit["compute_per_item_ms"].add_metric([model, e.id], e.per_item_ms)
                fit["compute_margin_ms"].add_metric([model, e.id], e.margin_ms)
            if known := self.table.speed(model):
                speed["capacity"].add_metric([model], known.rate)
                ahead = self.table.ahead(model, priority=0)
                speed["predicted_wait_ms"].add_metric([model], known.wait_ms(ahead))
            published = self.table.scale(model)
            for name, field in fields_of_scale.items():
                if field in published:
                    scale[name].add_metric([model], published[field])
            fields = self.table.counters(model)
            for route in ("L1", "L2"):
                routes.add_metric([model, route], fields.get(f"route:{route}", 0.0))
            for outcome in ("SUCCESS", "FAILURE"):
                outcomes.add_metric([model, outcome], fields.get(f"outcome:{outcome}", 0.0))
            shed.add_metric([model, "submit"], fields.get("shed:submit", 0.0))
            shed.add_metric([model, "claim"], fields.get("failure:DeadlineExceeded", 0.0))
            goodput.add_metric([model], fields.get("deadline:met", 0.0))
            late.add_metric([model], fields.get("deadline:missed", 0.0))
            for field, value in fields.items():
                if field.startswith("failure:"):
                    failures.add_metric([model, field.partition(":")[2]], value)
            for name, bounds in HISTOGRAMS.items():
                running, buckets = 0.0, []
                for bound in (*bounds, "+Inf"):
                    running += fields.get(f"{name}:{bound}", 0.0)
                    buckets.append((str(bound), running))
                histograms[name].add_metric([model], buckets, fields.get(f"{name}:sum", 0.0))
        yield from (l1, l2, retry, states, routes, outcomes, failures, shed, goodput, late)
        yield from (*speed.values(), *fit.values(), *scale.values(), *histograms.values())
        yield from self._fleet(GaugeMetricFamily, CounterMetricFamily)

    def _fleet(self, gauge, counter) -> Iterator:
        """What tandem:stats counts over every model, and the dead-letter list's length."""
        stats = self.table.stats()
        for name, text in STATS.items():
            yield counter(f"tandem_{name}", text, value=stats.get(name, 0))
        yield gauge(
            "tandem_dead_letters", "Dead letters kept now.", value=self.table.dead_letters()
        )


def serve(client: redis.Redis, port: int, address: str = "0.0.0.0") -> None:
    """Serve /metrics on a background thread."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    registry.register(Collector(client))
    start_http_server(port, addr=address, registry=registry)
