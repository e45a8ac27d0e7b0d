"""What the executor table reads: executors, models, depths, speeds, counters, and the
coordinator's own reads and writes outside the scripts. Mixed into Table
(broker/table.py); everything here needs only `self.redis`."""

from __future__ import annotations

from collections.abc import Sequence

import redis

from tandem.broker import keys
from tandem.broker.state import ExecutorInfo, ModelSpeed


def ms(seconds: int, micros: int) -> int:
    """Redis's TIME reply (seconds, microseconds) in epoch ms."""
    return seconds * 1000 + micros // 1000


class Reads:
    redis: redis.Redis

    def models(self) -> list[str]:
        return sorted(m.decode() for m in self.redis.smembers(keys.MODELS))

    def executor_ids(self, model: str) -> list[str]:
        return sorted(i.decode() for i in self.redis.smembers(keys.executors(model)))

    def executors(self, model: str | None = None) -> list[ExecutorInfo]:
        models = [model] if model else self.models()
        ids = [i for m in models for i in self.executor_ids(m)]
        with self.redis.pipeline(transaction=False) as pipe:
            for i in ids:
                pipe.hgetall(keys.executor(i))
                pipe.llen(keys.l2(i))
                pipe.llen(keys.inflight(i))
            replies = pipe.execute()
        rows = []
        for n, executor_id in enumerate(ids):
            h, l2_depth, inflight_depth = replies[3 * n : 3 * n + 3]
            if h:
                rows.append(ExecutorInfo.from_hash(executor_id, h, l2_depth, inflight_depth))
        return rows

    def lapsed(self, now_ms: int, limit: int = 1000) -> list[tuple[str, str]]:
        """(executor id, model) of executors whose heartbeat deadline is past, oldest first.
        An id whose hash is gone has model ""."""
        ids = self.redis.zrangebyscore(keys.DEADLINES, "-inf", now_ms, start=0, num=limit)
        if not ids:
            return []
        with self.redis.pipeline(transaction=False) as pipe:
            for i in ids:
                pipe.hget(keys.executor(i.decode()), "model")
            models = pipe.execute()
        return [(i.decode(), (m or b"").decode()) for i, m in zip(ids, models, strict=True)]

    def now_ms(self) -> int:
        """Redis's clock, in ms: the one every heartbeat deadline is set by."""
        return ms(*self.redis.time())

    def latest(self, name: str) -> str | None:
        """The highest version of a model that has a live executor, as NAME:VERSION."""
        now_ms = self.now_ms()
        live = {e.model for e in self.executors() if e.expires_ms > now_ms}
        versions = [m.partition(":")[2] for m in live if m.partition(":")[0] == name]
        if not versions:
            return None
        return f"{name}:{max(versions, key=keys.version_key)}"

    def speed(self, model: str) -> ModelSpeed | None:
        """The model's speed as route.lua predicts L1 waits from it; None while no
        executor has published one."""
        return ModelSpeed.from_hash(self.redis.hgetall(keys.speed(model)))

    # The coordinator's reads and writes outside the scripts

    def forget_deadline(self, executor_id: str) -> None:
        """Drop a heartbeat deadline whose executor hash is gone."""
        self.redis.zrem(keys.DEADLINES, executor_id)

    def exists(self, executor_id: str) -> bool:
        """True while the executor's hash is in the table."""
        return bool(self.redis.exists(keys.executor(executor_id)))

    def poison(self, limit: int) -> list[tuple[bytes, list[str]]]:
        """Up to `limit` poison messages waiting to be buried, each with the executors
        that died holding it, in order."""
        out = []
        for raw in self.redis.lrange(keys.POISON, 0, limit - 1):
            delivered = self.redis.lrange(keys.deliveries(raw), 0, -1)
            out.append((raw, [e.decode(errors="replace") for e in delivered]))
        return out

    def changes_since_relayed(self, block_ms: int = 0) -> list[tuple[bytes, dict]]:
        """The state changes after the last one relayed, up to 1000, waiting up to
        block_ms for one. On the first call ever, relaying starts from now."""
        last = self.redis.get(keys.RELAYED)
        if last is None:
            newest = self.redis.xrevrange(keys.STATE_STREAM, count=1)
            last = newest[0][0] if newest else "0-0"
            self.redis.set(keys.RELAYED, last)
        replies = self.redis.xread({keys.STATE_STREAM: last}, count=1000, block=block_ms or None)
        return replies[0][1] if replies else []

    def relay(self, changes: Sequence[str], last_id: bytes) -> None:
        """Publish these changes (JSON) on the state channel and mark up to last_id
        relayed, in one round trip."""
        with self.redis.pipeline(transaction=False) as pipe:
            for change in changes:
                pipe.publish(keys.STATE_CHANNEL, change)
            pipe.set(keys.RELAYED, last_id)
            pipe.execute()

    def counters(self, model: str) -> dict[str, float]:
        """The model's metrics hash (broker/metrics.py), field -> value."""
        return {k.decode(): float(v) for k, v in self.redis.hgetall(keys.metrics(model)).items()}

    def stats(self) -> dict[str, int]:
        """The fleet-wide counters of tandem:stats (redelivered, duplicates, ...)."""
        return {k.decode(): int(v) for k, v in self.redis.hgetall(keys.STATS).items()}

    def dead_letters(self) -> int:
        """How many dead letters are kept."""
        return self.redis.llen(keys.DEAD)

    def poisoned(self) -> int:
        """How many poison messages wait for the coordinator to bury them."""
        return self.redis.llen(keys.POISON)

    def retry_depth(self, model: str) -> int:
        """Redelivered tasks of the model waiting to be computed alone."""
        return self.redis.llen(keys.retry(model))

    def ahead(self, model: str, priority: int = 0) -> int:
        """The tasks a new one of this priority waits behind, as route.lua counts them:
        the retry list and L1 at its priority and before."""
        claims = keys.claim_keys(model)
        last = claims.index(keys.l1_for_priority(model, priority))
        with self.redis.pipeline(transaction=False) as pipe:
            for key in claims[: last + 1]:
                pipe.llen(key)
            return sum(pipe.execute())

    def l1_depth(self, model: str) -> int:
        with self.redis.pipeline(transaction=False) as pipe:
            for key in keys.l1_keys(model):
                pipe.llen(key)
            return sum(pipe.execute())
