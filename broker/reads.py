"""The executor table's reads for asyncio producers (producers/aio.py): the same keys
broker/table.py reads, on a redis.asyncio client."""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis

from tandem.broker import keys


async def versions(client: aioredis.Redis, name: str) -> list[str]:
    """Every NAME:VERSION of `name` a worker has served."""
    found: set[bytes] = await client.smembers(keys.MODELS)  # type: ignore[assignment]
    return [m.decode() for m in found if m.decode().partition(":")[0] == name]


async def live(client: aioredis.Redis, model: str) -> bool:
    """True while an executor of the model has a heartbeat that has not lapsed."""
    ids: set[Any] = await client.smembers(keys.executors(model))
    if not ids:
        return False
    seconds, micros = await client.time()
    now_ms = seconds * 1000 + micros // 1000
    scores = await client.zmscore(keys.DEADLINES, list(ids))
    return any(s is not None and s > now_ms for s in scores)


async def signature(client: aioredis.Redis, model: str) -> dict | None:
    """The tensor signature the model's workers published, with its slo_ms; None if no
    worker ever served it."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.hget(keys.SPECS, model)
        pipe.hget(keys.SLO, model)
        raw, slo = await pipe.execute()
    if raw is None:
        return None
    spec = json.loads(raw)
    spec["slo_ms"] = float(slo or 0)
    return spec
