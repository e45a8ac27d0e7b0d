"""The executors' table: registration, heartbeats, and each step of a batch's life
(begin, claim, state, store, count), over the script runner (broker/runner.py)."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from tandem.broker import keys
from tandem.broker.errors import ExecutorGone
from tandem.broker.readmodel import written
from tandem.broker.runner import Runner
from tandem.broker.scripts import layouts as lay
from tandem.broker.scripts.layouts import pack
from tandem.broker.signals import FullSignal
from tandem.broker.state import Batch, Speed, State


@functools.lru_cache(maxsize=1024)
def _complete_keys(executor_id: str, model: str) -> tuple[str, ...]:
    """complete.lua's keys: built once per executor, not once per store."""
    return tuple(
        pack(
            lay.CompleteKeys(
                inflight=keys.inflight(executor_id),
                dead=keys.DEAD,
                stats=keys.STATS,
                metrics=keys.metrics(model),
            )
        )
    )


def _claimed(reply) -> bool:
    """A claiming script's reply holds tasks (see Batch.claimed)."""
    return isinstance(reply, list) and len(reply) > 1


class Steps(Runner):
    """What an executor calls, each step at its named fault point."""

    def register(
        self,
        executor_id: str,
        model: str,
        *,
        worker: str,
        max_batch: int,
        ttl_ms: int,
        max_wait_ms: float,
        pid: int,
        max_queue: int = 0,
        slo_ms: float = 0,
    ) -> None:
        """Register an executor (WORKING, no capacity, no rate) and set its model's L1
        bound and SLO."""
        script_keys = lay.RegisterKeys(
            executor=keys.executor(executor_id),
            executors=keys.executors(model),
            models=keys.MODELS,
            changes=keys.STATE_STREAM,
            stats=keys.STATS,
            deadlines=keys.DEADLINES,
            speed=keys.speed(model),
        )
        args = lay.RegisterArgs(
            executor_id=executor_id,
            model=model,
            worker=worker,
            max_batch=max_batch,
            ttl_ms=ttl_ms,
            max_wait_ms=max_wait_ms,
            pid=pid,
            max_queue=max_queue,
            max_queue_hash=keys.MAX_QUEUE,
            ready=keys.ready(model),
            slo_ms=slo_ms,
            slo_hash=keys.SLO,
        )
        self._step(
            "register", lambda: self.scripts.register(keys=pack(script_keys), args=pack(args))
        )

    def publish_spec(self, model: str, spec: Mapping) -> None:
        """Publish the model's tensor signature (workers/models describe()) for gateways."""
        spec_json = json.dumps(spec, separators=(",", ":"))
        written(
            self.redis, keys.SPECS, "hash", lambda: self.redis.hset(keys.SPECS, model, spec_json)
        )

    def heartbeat(self, executor_ids: Sequence[str], ttl_ms: int) -> list[str]:
        """Refresh heartbeats; returns the ids that are no longer in the table."""
        if not executor_ids:
            return []
        script_keys = lay.HeartbeatKeys(
            deadlines=keys.DEADLINES,
            models=keys.MODELS,
            executors=[keys.executor(i) for i in executor_ids],
        )
        args = lay.HeartbeatArgs(
            ttl_ms=ttl_ms, executors_prefix=keys.EXECUTORS_PREFIX, ids=executor_ids
        )
        missing = self.scripts.heartbeat(keys=pack(script_keys), args=pack(args))
        return [executor_ids[i - 1] for i in missing]

    def begin(self, executor_id: str, model: str, *, room: int, taken: int) -> Batch:
        """Start a batch: take all of L2 and top up (an empty batch takes one retry task
        alone); go WORKING if anything is held."""
        script_keys = lay.BeginKeys(
            executor=keys.executor(executor_id),
            l2=keys.l2(executor_id),
            inflight=keys.inflight(executor_id),
            changes=keys.STATE_STREAM,
            retry=keys.retry(model),
            l1=keys.l1_keys(model),
        )
        args = lay.BeginArgs(
            executor_id=executor_id, room=room, taken=taken, metrics=keys.metrics(model)
        )
        return Batch.claimed(self._call("begin", script_keys, args, holds=_claimed))

    def claim(self, executor_id: str, model: str, n: int, *, alone: bool = False) -> Batch:
        """Claim into in-flight: one retry task if `alone` (the batch is empty) and there is
        one, else up to n tasks from L1, oldest and highest priority first."""
        script_keys = lay.ClaimKeys(
            executor=keys.executor(executor_id),
            inflight=keys.inflight(executor_id),
            retry=keys.retry(model),
            l1=keys.l1_keys(model),
        )
        args = lay.ClaimArgs(n=n, alone="1" if alone else "0")
        return Batch.claimed(self._call("claim", script_keys, args, holds=_claimed))

    def claim_or_idle(self, executor_id: str, model: str, max_batch: int) -> Batch | None:
        """After a compute, one round trip: the next batch (one redelivered task alone, or
        up to max_batch from L1), or None when there was none and the executor went IDLE
        (or is STOPPING) in the same atomic step."""
        script_keys = lay.ClaimOrIdleKeys(
            executor=keys.executor(executor_id),
            inflight=keys.inflight(executor_id),
            changes=keys.STATE_STREAM,
            retry=keys.retry(model),
            l1=keys.l1_keys(model),
        )
        args = lay.ClaimOrIdleArgs(
            executor_id=executor_id, max_batch=max_batch, metrics=keys.metrics(model)
        )
        reply = self._call("claim_or_idle", script_keys, args, holds=_claimed)
        return None if reply[0] == lay.WENT_IDLE else Batch.claimed(reply)

    def unclaim(self, executor_id: str, model: str, raws: Sequence[bytes]) -> int:
        """Hand claimed, unstarted tasks back to the head of L1, in the order given."""
        script_keys = lay.UnclaimKeys(inflight=keys.inflight(executor_id), l1=keys.l1_keys(model))
        return self._call("unclaim", script_keys, lay.UnclaimArgs(messages=raws))

    def set_state(self, executor_id: str, model: str, state: State) -> int:
        """Record WAITING or STOPPING; returns the executor's capacity after it."""
        script_keys = lay.StateKeys(
            executor=keys.executor(executor_id),
            changes=keys.STATE_STREAM,
            speed=keys.speed(model),
        )
        args = lay.StateArgs(
            executor_id=executor_id, state=state.value, metrics=keys.metrics(model)
        )
        return self._call("state", script_keys, args)

    def wait_l2(self, executor_id: str, timeout_s: float) -> bytes | None:
        """Block up to timeout_s for the next L2 task, moving it into in-flight. With
        min_replicas, a task taken is held until the replicas hold the move: a WAIT
        behind the fence key, in a round trip of its own once a task came (a WAIT after
        a fresh write covers every earlier one; none is paid for an empty poll)."""
        l2, inflight = keys.l2(executor_id), keys.inflight(executor_id)
        reply = self._step(
            "wait_l2",
            lambda: self.direct.command(
                "BLMOVE", l2, inflight, "RIGHT", "LEFT", timeout_s, once=True
            ),
        )
        if reply is not None and self.settings.min_replicas:
            acked = self._fenced("wait_l2")
            if acked < self.settings.min_replicas:
                self.await_replicas("wait_l2", acked)
        return reply

    def wait_full(self, signal: FullSignal, timeout_s: float) -> bool:
        """WAITING: block up to timeout_s for route.lua's word that the batch is full.
        Always True (the fault point "window" counts every wait that ended)."""
        return self._step("window", lambda: signal.wait(timeout_s) or True)

    def complete(
        self,
        executor_id: str,
        entries: Sequence[tuple[bytes, str, str]],
        *,
        model: str = "",
        wake_first: bool = False,
    ) -> int:
        """Store results and drop their tasks from in-flight. Entries: (raw, result key,
        result JSON), or (raw, "", dead-letter record) for a message without a usable id.
        The batch's bookkeeping follows in count_batch(), with that of other batches.
        wake_first: the producers waiting for these results are woken before this caller
        (DirectCalls.script's `publishes`), for a store on the task's path at low load.
        Returns the batch's size, negated when the call stored nothing new and found none
        of its tasks in in-flight (a retry, a task answered already): nothing to count."""
        s = self.settings
        args = pack(
            lay.CompleteArgs(
                result_ttl=s.result_expires_s,
                dead_cap=s.dead_letter_max,
                dead_ttl=s.dead_letter_ttl_s,
                batch=[],
            )
        )
        # Then the keys and these are the same each time: packed once (DirectCalls.script).
        same = len(args)
        for entry in entries:
            args.extend(entry)
        script_keys = _complete_keys(executor_id, model)
        return self._held(
            "complete",
            lambda then: self.direct.script(
                self.scripts.complete,
                script_keys,
                args,
                then=then,
                publishes=wake_first,
                same=len(script_keys) + same,
            ),
            holds=bool,
        )

    def count_batch(
        self,
        executor_id: str,
        model: str,
        tasks: int,
        *,
        batches: int = 1,
        counters: Mapping[str, float] | None = None,
        speed: Speed | None = None,
    ) -> None:
        """The bookkeeping of batches whose results complete() stored:
        their metrics counters, them and their tasks in the executor's counts, and the
        latency model when given. Sent once: a lost reply may lose these counts, never
        double them."""
        script_keys = pack(
            lay.CountKeys(
                executor=keys.executor(executor_id),
                metrics=keys.metrics(model),
                speed=[keys.speed(model)] if speed is not None else [],
            )
        )
        args = pack(
            lay.CountArgs(tasks=tasks, batches=batches, bookkeeping=bookkeeping(counters, speed))
        )
        self._step(
            "count", lambda: self.direct.script(self.scripts.count, script_keys, args, once=True)
        )

    def _call(self, name: str, script_keys: tuple, args: tuple, *, holds=None):
        """Run an executor's script, its keys and args as their layouts; holds: it takes
        custody (see Runner._held). A GONE from the script raises ExecutorGone."""
        script = getattr(self.scripts, name)
        packed_keys, packed_args = pack(script_keys), pack(args)
        try:
            if holds is not None:
                # A claim is sent once: run twice after a lost reply, it would leave the
                # first run's tasks in flight with no one computing them. Raised, the
                # executor hands all it holds back and registers again.
                return self._held(
                    name,
                    lambda then: self.direct.script(
                        script, packed_keys, packed_args, once=True, then=then
                    ),
                    holds,
                )
            return self._step(name, lambda: self.direct.script(script, packed_keys, packed_args))
        except redis.ResponseError as e:
            if str(e).startswith("GONE"):
                raise ExecutorGone(packed_keys[0]) from e
            raise

    def reserved(self, executor_id: str) -> list[bytes]:
        """Every message in an executor's L2 and in-flight lists."""
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.lrange(keys.l2(executor_id), 0, -1)
            pipe.lrange(keys.inflight(executor_id), 0, -1)
            l2, inflight = pipe.execute()
        return [*l2, *inflight]


def bookkeeping(counters: Mapping[str, float] | None, speed: Speed | None) -> list[Any]:
    """Batches' counters and latency model as count.lua takes them: M,
    then M (metrics field, increment) pairs, then the latency model (NO_SPEED: none)."""
    counters = counters or {}
    args: list[Any] = [len(counters)]
    for field, value in counters.items():
        args.extend((field, value))
    return args + _speed_args(speed)


#: The latency model's arguments when none is given.
NO_SPEED = ("", 0, 0, 0, 0, 0)


def _speed_args(speed: Speed | None) -> list:
    if speed is None:
        return list(NO_SPEED)
    return [speed.rate, speed.lag_ms, speed.extra_ms, speed.base_ms, speed.per_item_ms,
            speed.margin_ms]  # fmt: skip
