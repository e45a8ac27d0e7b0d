"""The coordinator's reads for the scaling signal (coordinator/scaling.py), every model at
once: two pipelined round trips to read and one to publish, however many models and
executors there are. Measured four times a second, one round trip per key would keep
the coordinator from its feed for O(models) round trips each time.

The reads are total, as in broker/readmodel.py: a key of the wrong type reads as empty.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from tandem.broker import keys
from tandem.broker.readmodel import numbers, text, typed_reply, written
from tandem.broker.state import ExecutorInfo

#: The fields of an executor's hash that the signal reads: liveness, its latency model
#: (capacity at the SLO), and its worker and state (pod deletion costs). HMGET of these
#: alone parses half of what HGETALL would, which counts at thousands of executors.
FIELDS = (
    "model", "worker", "state", "expires_ms", "max_batch", "rate", "base_ms",
    "per_item_ms", "margin_ms", "lag_ms", "extra_ms",
)  # fmt: skip


@dataclass
class Demand:
    """What one model's signal reads: its executors (live or not; FIELDS of each), its
    metric counters, how many wait in its L1 and retry lists, its SLO and its last
    published signal."""

    executors: list[ExecutorInfo] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)
    l1_depth: int = 0
    retry_depth: int = 0
    slo_ms: float | None = None
    published: dict[str, float] = field(default_factory=dict)


class Demands:
    redis: redis.Redis

    def demands(self, models: Iterable[str]) -> dict[str, Demand]:
        """Each model's Demand, in two round trips."""
        models = list(models)
        with self.redis.pipeline(transaction=False) as pipe:
            for model in models:
                pipe.smembers(keys.executors(model))
            members = pipe.execute(raise_on_error=False)
        ids = {
            model: sorted(filter(None, (text(i, key) for i in typed_reply(found, key, set()))))
            for model, found, key in zip(
                models, members, (keys.executors(m) for m in models), strict=True
            )
        }
        reads: list[tuple[str, Any]] = []  # (key, default) of each pipelined reply
        with self.redis.pipeline(transaction=False) as pipe:
            for model in models:
                for i in ids[model]:
                    pipe.hmget(keys.executor(i), FIELDS)
                    pipe.llen(keys.l2(i))
                    pipe.llen(keys.inflight(i))
                    reads += [(keys.executor(i), []), (keys.l2(i), 0), (keys.inflight(i), 0)]
                pipe.hgetall(keys.metrics(model))
                pipe.hgetall(keys.scale(model))
                pipe.hget(keys.SLO, model)
                reads += [(keys.metrics(model), {}), (keys.scale(model), {}), (keys.SLO, None)]
                for key in keys.claim_keys(model):
                    pipe.llen(key)
                    reads.append((key, 0))
            replies = iter(
                typed_reply(reply, key, default)
                for reply, (key, default) in zip(
                    pipe.execute(raise_on_error=False), reads, strict=True
                )
            )
        out = {}
        for model in models:
            demand = out[model] = Demand()
            for i in ids[model]:
                values, l2_depth, inflight_depth = next(replies), next(replies), next(replies)
                h = {f.encode(): v for f, v in zip(FIELDS, values, strict=False) if v is not None}
                if h:
                    demand.executors.append(ExecutorInfo.from_hash(i, h, l2_depth, inflight_depth))
            demand.counters = numbers(next(replies), keys.metrics(model))
            demand.published = numbers(next(replies), keys.scale(model))
            slo = next(replies)
            slo = numbers({b"slo": slo}, keys.SLO).get("slo", 0.0) if slo is not None else 0.0
            demand.slo_ms = slo if slo > 0 else None
            demand.retry_depth = next(replies)
            demand.l1_depth = sum(next(replies) for _ in keys.l1_keys(model))
        return out

    def publish_scales(self, signals: dict[str, dict[str, float]]) -> None:
        """Write each model's scaling signal (keys.scale) in one round trip; a key of the
        wrong type is moved aside and written again."""
        with self.redis.pipeline(transaction=False) as pipe:
            for model, fields in signals.items():
                pipe.hset(keys.scale(model), mapping=fields)  # type: ignore[arg-type]
            replies = pipe.execute(raise_on_error=False)
        for (model, fields), reply in zip(signals.items(), replies, strict=True):
            if isinstance(reply, Exception):
                key = keys.scale(model)
                write = functools.partial(self.redis.hset, key, mapping=fields)  # type: ignore[arg-type]
                written(self.redis, key, "hash", write)
