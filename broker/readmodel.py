"""What the executor table reads: executors, models, depths, speeds, counters, and the
coordinator's own reads and writes outside the scripts. Mixed into Table
(broker/table.py); everything here needs only `self.redis`.

Every read is total: a key of the wrong type reads as empty, a member or field that is
not UTF-8, not NAME:VERSION or not a number is skipped, and each such finding is logged
once per process. Nothing written into tandem's keys by hand ends a reader."""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis

from tandem.broker import keys
from tandem.broker.state import ExecutorInfo, ModelSpeed

log = logging.getLogger("tandem.reads")
T = TypeVar("T")
_logged: set[str] = set()


def once(text: str) -> None:
    """Log a finding about tandem's keys once per process (a sweep meets it every tick)."""
    if text not in _logged:
        _logged.add(text)
        log.warning("%s", text)


def typed(key: str, default: Any, read: Callable[[], Any]) -> Any:
    """read(), or `default` if the key holds another type (WRONGTYPE). Replies are Any:
    what a key holds is checked where it is read, not promised by redis-py."""
    try:
        return read()
    except redis.ResponseError as e:
        if "WRONGTYPE" not in str(e):
            raise
        once(f"{key} holds a value of the wrong type; read as empty")
        return default


def typed_reply(reply, key: str, default):
    """A pipelined reply (execute(raise_on_error=False)), or `default` for a WRONGTYPE
    (logged once); any other error is raised."""
    if isinstance(reply, redis.ResponseError) and "WRONGTYPE" in str(reply):
        once(f"{key} holds a value of the wrong type; read as empty")
        return default
    if isinstance(reply, Exception):
        raise reply
    return reply


def written(client: redis.Redis, key: str, wanted: str, write: Callable[[], T]) -> T:
    """write(); if the key holds another type (WRONGTYPE), it is moved aside to
    KEY:wrongtype, as the scripts do (broker/scripts/_lib.lua set_aside), and write()
    runs again on a fresh key."""
    try:
        return write()
    except redis.ResponseError as e:
        found = client.type(key)
        found = found.decode() if isinstance(found, bytes) else found
        if "WRONGTYPE" not in str(e) or found in (wanted, "none"):
            raise
        client.rename(key, key + ":wrongtype")
        log.warning("%s held a %s, not a %s; moved to %s:wrongtype", key, found, wanted, key)
        return write()


def text(raw: bytes, where: str) -> str | None:
    """A member or field as text, or None (logged once) if it is not UTF-8."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        once(f"{where}: {raw[:40]!r} is not UTF-8; skipped")
        return None


def numbers(h: dict, where: str) -> dict[str, float]:
    """A hash of counters, field -> finite number; anything else skipped (logged once)."""
    out = {}
    for field, value in h.items():
        name = text(field, where)
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if name is None or not math.isfinite(number):
            once(f"{where}: field {field[:40]!r} = {value[:40]!r} is not a number; skipped")
            continue
        out[name] = number
    return out


def model_name(raw: bytes, where: str) -> str | None:
    name = text(raw, where)
    if name is None:
        return None
    try:
        keys.parse_model(name)
    except ValueError:
        once(f"{where}: {name[:60]!r} is not NAME:VERSION; skipped")
        return None
    return name


def ms(seconds: int, micros: int) -> int:
    """Redis's TIME reply (seconds, microseconds) in epoch ms."""
    return seconds * 1000 + micros // 1000


class Reads:
    redis: redis.Redis

    def models(self) -> list[str]:
        members = typed(keys.MODELS, set(), lambda: self.redis.smembers(keys.MODELS))
        return sorted(filter(None, (model_name(m, keys.MODELS) for m in members)))

    def spec(self, model: str) -> dict | None:
        """The model's published tensor signature, or None."""
        raw = typed(keys.SPECS, None, lambda: self.redis.hget(keys.SPECS, model))
        try:
            return None if raw is None else json.loads(raw)
        except ValueError:
            once(f"{keys.SPECS} holds no JSON for {model!r}; read as none")
            return None

    def executor_ids(self, model: str) -> list[str]:
        key = keys.executors(model)
        members = typed(key, set(), lambda: self.redis.smembers(key))
        return sorted(filter(None, (text(i, key) for i in members)))

    def executors(self, model: str | None = None) -> list[ExecutorInfo]:
        models = [model] if model else self.models()
        ids = [i for m in models for i in self.executor_ids(m)]
        with self.redis.pipeline(transaction=False) as pipe:
            for i in ids:
                pipe.hgetall(keys.executor(i))
                pipe.llen(keys.l2(i))
                pipe.llen(keys.inflight(i))
            replies = pipe.execute(raise_on_error=False)
        rows = []
        for n, executor_id in enumerate(ids):
            where = (keys.executor(executor_id), keys.l2(executor_id), keys.inflight(executor_id))
            h, l2_depth, inflight_depth = (
                self._typed_reply(r, key, d)
                for r, key, d in zip(replies[3 * n : 3 * n + 3], where, ({}, 0, 0), strict=True)
            )
            if h:
                rows.append(ExecutorInfo.from_hash(executor_id, h, l2_depth, inflight_depth))
        return rows

    @staticmethod
    def _typed_reply(reply, key: str, default):
        return typed_reply(reply, key, default)

    def lapsed(self, now_ms: int, limit: int = 1000) -> list[tuple[str, str]]:
        """(executor id, model) of executors whose heartbeat deadline is past, oldest first.
        An id whose hash is gone (or unreadable) has model ""."""
        raw = typed(
            keys.DEADLINES,
            [],
            lambda: self.redis.zrangebyscore(keys.DEADLINES, "-inf", now_ms, start=0, num=limit),
        )
        ids = list(filter(None, (text(i, keys.DEADLINES) for i in raw)))
        if not ids:
            return []
        with self.redis.pipeline(transaction=False) as pipe:
            for i in ids:
                pipe.hget(keys.executor(i), "model")
            models = pipe.execute(raise_on_error=False)
        out = []
        for i, m in zip(ids, models, strict=True):
            m = self._typed_reply(m, keys.executor(i), None)
            out.append((i, (m and model_name(m, keys.executor(i))) or ""))
        return out

    def now_ms(self) -> int:
        """Redis's clock, in ms: the one every heartbeat deadline is set by."""
        return ms(*self.redis.time())

    def latest(self, name: str) -> str | None:
        """The highest version of a model that has a live executor, as NAME:VERSION; with
        none live, the highest version a worker ever served (a submit then waits in its
        L1, or is refused if it has a deadline); None if no worker ever served one."""
        now_ms = self.now_ms()
        live = {e.model for e in self.executors() if e.expires_ms > now_ms}
        versions = [m.partition(":")[2] for m in live if m.partition(":")[0] == name]
        if not versions:
            versions = [m.partition(":")[2] for m in self.models() if m.partition(":")[0] == name]
        if not versions:
            return None
        return f"{name}:{max(versions, key=keys.version_key)}"

    def speed(self, model: str) -> ModelSpeed | None:
        """The model's speed as route.lua predicts L1 waits from it; None while no
        executor has published one."""
        key = keys.speed(model)
        return ModelSpeed.from_hash(typed(key, {}, lambda: self.redis.hgetall(key)))

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
        for raw in typed(keys.POISON, [], lambda: self.redis.lrange(keys.POISON, 0, limit - 1)):
            key = keys.deliveries(raw)
            delivered = typed(key, [], functools.partial(self.redis.lrange, key, 0, -1))
            out.append((raw, [e.decode(errors="replace") for e in delivered]))
        return out

    def changes_since_relayed(self, block_ms: int = 0) -> list[tuple[bytes, dict]]:
        """The state changes after the last one relayed, up to 1000, waiting up to
        block_ms for one. On the first call ever, relaying starts from now."""
        last = typed(keys.RELAYED, None, lambda: self.redis.get(keys.RELAYED))
        if last is None:
            last = self._relay_from_now()
        try:
            replies: Any = self.redis.xread(
                {keys.STATE_STREAM: last}, count=1000, block=block_ms or None
            )
        except redis.ResponseError as e:  # not a stream id, or the stream is not a stream
            once(f"cannot read {keys.STATE_STREAM} after {last[:40]!r} ({e}); relaying from now")
            self.redis.delete(keys.RELAYED)
            return []
        return replies[0][1] if replies else []

    def _relay_from_now(self) -> bytes | str:
        newest = typed(
            keys.STATE_STREAM, [], lambda: self.redis.xrevrange(keys.STATE_STREAM, count=1)
        )
        last = newest[0][0] if newest else "0-0"
        self.redis.set(keys.RELAYED, last)
        return last

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
        key = keys.metrics(model)
        return numbers(typed(key, {}, lambda: self.redis.hgetall(key)), key)

    def scale(self, model: str) -> dict[str, float]:
        """The model's scaling signal as the coordinator last published it (keys.scale)."""
        key = keys.scale(model)
        return numbers(typed(key, {}, lambda: self.redis.hgetall(key)), key)

    def stats(self) -> dict[str, int]:
        """The fleet-wide counters of tandem:stats (redelivered, duplicates, ...)."""
        found = numbers(typed(keys.STATS, {}, lambda: self.redis.hgetall(keys.STATS)), keys.STATS)
        return {name: int(value) for name, value in found.items()}

    def dead_letters(self) -> int:
        """How many dead letters are kept."""
        return typed(keys.DEAD, 0, lambda: self.redis.llen(keys.DEAD))

    def poisoned(self) -> int:
        """How many poison messages wait for the coordinator to bury them."""
        return typed(keys.POISON, 0, lambda: self.redis.llen(keys.POISON))

    def retry_depth(self, model: str) -> int:
        """Redelivered tasks of the model waiting to be computed alone."""
        key = keys.retry(model)
        return typed(key, 0, lambda: self.redis.llen(key))

    def ahead(self, model: str, priority: int = 0) -> int:
        """The tasks a new one of this priority waits behind, as route.lua counts them:
        the retry list and L1 at its priority and before."""
        claims = keys.claim_keys(model)
        last = claims.index(keys.l1_for_priority(model, priority))
        return self._lengths(claims[: last + 1])

    def l1_depth(self, model: str) -> int:
        return self._lengths(keys.l1_keys(model))

    def _lengths(self, lists: Sequence[str]) -> int:
        """The summed length of these lists in one round trip; one of the wrong type
        counts 0."""
        with self.redis.pipeline(transaction=False) as pipe:
            for key in lists:
                pipe.llen(key)
            replies = pipe.execute(raise_on_error=False)
        return sum(self._typed_reply(r, key, 0) for r, key in zip(replies, lists, strict=True))
