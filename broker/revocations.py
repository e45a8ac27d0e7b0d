"""Revocation records: a sorted set of revoked task ids, scored by when each record
expires, which every executor asks before it computes (workers/prepare.py). Mixed into
Table (broker/table.py); `record` writes the same from asyncio (producers/aio.py)."""

from __future__ import annotations

from collections.abc import Sequence

import redis
import redis.asyncio as aioredis

from tandem.broker import keys
from tandem.broker.readmodel import ms, typed, typed_reply, written


class Revocations:
    redis: redis.Redis

    def revoke(self, task_ids: Sequence[str], ttl_s: float) -> None:
        """Record revoked ids for ttl_s seconds; expired records are dropped on the way."""
        now = ms(*self.redis.time())

        def write() -> None:
            with self.redis.pipeline(transaction=False) as pipe:
                pipe.zadd(keys.REVOKED, {t: now + int(ttl_s * 1000) for t in task_ids})
                pipe.zremrangebyscore(keys.REVOKED, "-inf", now)
                pipe.execute()

        written(self.redis, keys.REVOKED, "zset", write)

    def revoked(self, task_ids: Sequence[str]) -> set[str]:
        """Which of task_ids have a live revocation record."""
        if not task_ids:
            return set()
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.time()
            pipe.zmscore(keys.REVOKED, list(task_ids))
            (now_s, now_us), scores = pipe.execute(raise_on_error=False)
        scores = typed_reply(scores, keys.REVOKED, [None] * len(task_ids))  # wrong type: none
        now = ms(now_s, now_us)
        return {i for i, s in zip(task_ids, scores, strict=True) if s is not None and s > now}

    def revocations(self) -> int:
        """How many revocation records exist (expired ones included until pruned)."""
        return typed(keys.REVOKED, 0, lambda: self.redis.zcard(keys.REVOKED))


async def record(client: aioredis.Redis, task_ids: Sequence[str], ttl_s: float) -> None:
    """Revocations.revoke on a redis.asyncio client: the records, expired ones dropped."""
    seconds, micros = await client.time()
    now = ms(seconds, micros)
    async with client.pipeline(transaction=False) as pipe:
        pipe.zadd(keys.REVOKED, {t: now + int(ttl_s * 1000) for t in task_ids})
        pipe.zremrangebyscore(keys.REVOKED, "-inf", now)
        await pipe.execute()
