"""The coordinator's table: feeding L1 to ready executors, reclaiming what a lapsed
executor held, burying poison messages, and the coordinator's lease, over the script
runner (broker/runner.py)."""

from __future__ import annotations

from collections.abc import Sequence

import redis

from tandem.broker import keys
from tandem.broker.runner import Runner
from tandem.broker.scripts import layouts as lay
from tandem.broker.scripts.layouts import pack


class Upkeep(Runner):
    """What the coordinator calls."""

    def feed(self, models: Sequence[str]) -> int:
        """Hand tasks waiting in each model's L1 to its ready executors, as the route would
        have; returns how many. For tasks that skipped the route (plain Celery clients).
        Every model's script in one pipelined round trip: the coordinator feeds every
        feed_ms, and a round trip a model would make its loop grow with the models."""
        calls = [_feed_call(model) for model in models]
        with self.redis.pipeline(transaction=False) as pipe:
            for script_keys, args in calls:
                pipe.evalsha(self.scripts.feed.sha, len(script_keys), *script_keys, *args)
            replies = pipe.execute(raise_on_error=False)
        moved = 0
        for (script_keys, args), reply in zip(calls, replies, strict=True):
            if isinstance(reply, redis.exceptions.NoScriptError):  # Redis restarted, or flushed
                reply = self.scripts.feed(keys=script_keys, args=args)
            elif isinstance(reply, Exception):
                raise reply
            moved += int(reply)
        return moved

    def reclaim(
        self, executor_id: str, model: str, *, force: bool = False, count: bool = False
    ) -> int:
        """Hand the executor's L2 and in-flight back and remove it; -1 if it is alive.

        count: it died or crashed holding its in-flight tasks, so each gets a delivery;
        they then go to the retry list, or at max_deliveries to the poison list.
        """
        l1_0, l1_3, l1_6, l1_9 = keys.l1_keys(model)
        script_keys = lay.ReclaimKeys(
            executor=keys.executor(executor_id),
            executors=keys.executors(model),
            l2=keys.l2(executor_id),
            inflight=keys.inflight(executor_id),
            changes=keys.STATE_STREAM,
            stats=keys.STATS,
            retry=keys.retry(model),
            poison=keys.POISON,
            l1_0=l1_0,
            l1_3=l1_3,
            l1_6=l1_6,
            l1_9=l1_9,
            deadlines=keys.DEADLINES,
            speed=keys.speed(model),
        )
        args = lay.ReclaimArgs(
            executor_id=executor_id,
            force="1" if force else "0",
            count_deliveries="1" if count else "0",
            max_deliveries=self.settings.max_deliveries,
            deliveries_prefix=keys.DELIVERIES_PREFIX,
            deliveries_ttl=self.settings.result_expires_s,
            metrics=keys.metrics(model),
        )
        return self._step(
            "reclaim", lambda: self.scripts.reclaim(keys=pack(script_keys), args=pack(args))
        )

    def bury(self, raw: bytes, record: str, task_id: str | None, meta: str) -> bool:
        """Quarantine one poison message: its FAILURE `meta` (if it has an id) and its
        dead-letter record. False if another coordinator buried it first."""
        s = self.settings
        script_keys = lay.BuryKeys(
            poison=keys.POISON,
            dead=keys.DEAD,
            deliveries=keys.deliveries(raw),
            stats=keys.STATS,
            result=[keys.result(task_id)] if task_id is not None else [],
        )
        args = lay.BuryArgs(
            raw=raw,
            record=record,
            dead_cap=s.dead_letter_max,
            dead_ttl=s.dead_letter_ttl_s,
            result_meta=[meta, s.result_expires_s] if task_id is not None else [],
        )
        return bool(self.scripts.bury(keys=pack(script_keys), args=pack(args)))

    def lease(self, holder: str, ttl_ms: int) -> str:
        """Take, or keep for ttl_ms more, the coordinator's lease (ttl_ms 0 gives it up);
        returns who holds it now ("" for no one)."""
        reply = self.scripts.lease(
            keys=pack(lay.LeaseKeys(lease=keys.COORDINATOR)),
            args=pack(lay.LeaseArgs(holder=holder, ttl_ms=ttl_ms)),
        )
        return reply.decode() if isinstance(reply, bytes) else ""


def _feed_call(model: str) -> tuple[list, list]:
    """feed.lua's keys and arguments for one model."""
    script_keys = lay.FeedKeys(ready_set=keys.ready(model), l1=keys.l1_keys(model))
    args = lay.FeedArgs(
        executor_prefix=keys.EXECUTOR_PREFIX,
        l2_prefix=keys.L2_PREFIX,
        full_prefix=keys.FULL_PREFIX,
        metrics=keys.metrics(model),
    )
    return pack(script_keys), pack(args)
