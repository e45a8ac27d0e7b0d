"""The executor table: every executor's model, state, capacity and heartbeat, in Redis.

All writes go through the atomic scripts in broker/scripts.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import redis

from tandem.broker import keys
from tandem.broker.direct import DirectCalls
from tandem.broker.errors import (
    BrokerUnavailable,
    ExecutorGone,
    NotReplicated,
    Overloaded,
    QueueFull,
    TandemError,
    UnknownModel,
)
from tandem.broker.faults import Faults
from tandem.broker.readmodel import Reads, once, typed, written
from tandem.broker.retry import DISCONNECTS, Backoff
from tandem.broker.revocations import Revocations
from tandem.broker.scripts import Scripts
from tandem.broker.settings import Settings
from tandem.broker.signals import FullSignal
from tandem.broker.state import Batch, Speed, State

#: Messages per route script call: a burst is routed in calls of this many, so that
#: no single call holds Redis for long.
ROUTE_CHUNK = 256

log = logging.getLogger("tandem.table")


def routed_reply(model: str, reply: bytes | int | list) -> str | None | QueueFull | Overloaded:
    """One message's route reply: an executor id, 0 (L1), -depth (refused: L1 is full),
    or [wait ms, tasks ahead, ms left] (refused: the wait passes its deadline; a wait of
    -1: no executor is live)."""
    if isinstance(reply, bytes):
        return reply.decode()
    if isinstance(reply, list):
        wait_ms, ahead, left_ms = reply
        if wait_ms < 0:
            return Overloaded(
                f"no live executor serves {model}: a task with a deadline is refused at "
                f"once ({ahead} tasks wait in its first-level queue); nothing was enqueued. "
                "Start a worker for it, or submit without a deadline to wait in L1",
                wait_s=math.inf,
                deadline_s=left_ms / 1000,
                ahead=ahead,
            )
        return Overloaded(
            f"{model} is overloaded: the predicted wait is {wait_ms} ms ({ahead} tasks "
            f"ahead), past the task's deadline in {left_ms} ms; nothing was enqueued",
            wait_s=wait_ms / 1000,
            deadline_s=left_ms / 1000,
            ahead=ahead,
        )
    if reply < 0:
        return QueueFull(f"{model} has {-reply} tasks waiting")
    return None


@functools.lru_cache(maxsize=1024)
def _route_layout(model: str, priority: int) -> tuple[tuple[str, ...], tuple]:
    """route.lua's keys for a model and priority, and its arguments but the time left and
    the messages: built once per model and priority, not once per submit."""
    l1_keys = keys.l1_keys(model)
    target = keys.l1_for_priority(model, priority)
    script_keys = (
        keys.ready(model),
        keys.MODELS,
        target,
        keys.retry(model),
        keys.speed(model),
        keys.SLO,
        keys.executors(model),
        *l1_keys,
    )
    head = (
        model,
        keys.EXECUTOR_PREFIX,
        keys.L2_PREFIX,
        keys.MAX_QUEUE,
        keys.metrics(model),
        keys.FULL_PREFIX,
        l1_keys.index(target) + 1,
    )
    return script_keys, head


@functools.lru_cache(maxsize=1024)
def _complete_keys(executor_id: str, model: str, speed: bool) -> tuple[str, ...]:
    """complete.lua's keys: built once per executor, not once per store."""
    return (
        keys.inflight(executor_id),
        keys.executor(executor_id),
        keys.DEAD,
        keys.STATS,
        keys.metrics(model),
        *([keys.speed(model)] if speed else []),
    )


def _claimed(reply) -> bool:
    """A claiming script's reply holds tasks (see Batch.claimed)."""
    return isinstance(reply, list) and len(reply) > 1


def _partial(error: TandemError, routed: list) -> TandemError:
    error.routed = routed
    return error


def _gone(e: redis.ResponseError) -> bool:
    return str(e).startswith("GONE")


class Table(Reads, Revocations):
    """The executor table and the scripts that change it, bound to one Redis client: the
    producers' route, the executors' steps, the coordinator's reclaim and bury. What it
    reads is in broker/readmodel.py (Reads), the revocation records in
    broker/revocations.py (Revocations); a Table is both.

    `settings` gives the delivery limit and the result and dead-letter lifetimes.
    Each executor step passes a named fault point (broker/faults.py): `faults`, given by
    the process that runs executors (for tests), else none.
    """

    def __init__(
        self, client: redis.Redis, settings: Settings | None = None, faults: Faults | None = None
    ) -> None:
        self.redis = client
        self.settings = settings or Settings()
        self.scripts = Scripts(client)
        #: Connections of its own for the low-load path's round trips.
        self.direct = DirectCalls(client)
        self.faults = faults if faults is not None else Faults()
        self._patience = threading.local()  # per executor thread: see patience()

    def _step(self, name: str, call, *args):
        """call(*args), at the fault and trace point `name`."""
        faults = self.faults
        if not faults.active:
            return call(*args)
        faults.at(name, "before")
        reply = call(*args)
        faults.at(name, "after", reply)
        return reply

    def _held(self, name: str, step, holds) -> Any:
        """An executor's step that takes custody of tasks or results (a claim, a store):
        step(then) makes its call, with `then` (None, or a WAIT) sent after it in the same
        write, and returns its reply, or (its reply, WAIT's) (DirectCalls.script). With
        min_replicas, WAIT goes in the same round trip, and when the reply holds something
        (holds(reply)) that fewer replicas acknowledged, the step waits for them
        (await_replicas) before it returns: no task is computed, and no batch counted
        stored, that a failover could take back."""
        wanted = self.settings.min_replicas
        if not wanted:
            return self._step(name, step, None)
        acked = []

        def run():
            reply, count = step(("WAIT", wanted, self.settings.replica_timeout_ms))
            acked.append(count)
            return reply

        reply = self._step(name, run)
        if acked[0] < wanted and holds(reply):
            self.await_replicas(name, acked[0])
        return reply

    def patience(self, each_try, stop: threading.Event | None) -> None:
        """How steps on the calling thread wait for replicas (await_replicas): each_try()
        at every try, giving up once stop is set. Set once per executor thread."""
        self._patience.each_try, self._patience.stop = each_try, stop

    def await_replicas(self, name: str, acked: int) -> None:
        """Wait until min_replicas replicas hold this thread's writes: write the fence key
        and WAIT, again and again (a replica that holds the fence holds every write before
        it). A disconnect is raised: on a new primary the step may or may not have
        happened, and the caller rebuilds (a claim hands its batch back; a store runs
        again, which changes nothing it already made). Given up once the thread's stop
        is set: the write stays on the primary alone."""
        wanted, timeout_ms = self.settings.min_replicas, self.settings.replica_timeout_ms
        each_try = getattr(self._patience, "each_try", None)
        stop = getattr(self._patience, "stop", None)
        log.warning(
            "%s: %d of %d replica(s) acknowledged within %d ms; waiting for them before going on",
            name,
            acked,
            wanted,
            timeout_ms,
        )
        backoff = Backoff(cap_s=1.0)
        while acked < wanted:
            if stop is not None and stop.is_set():
                log.warning("%s: stopping; its write is on the primary alone", name)
                return
            if each_try is not None:
                each_try()
            acked = self._fenced(name)
            if acked < wanted:
                (stop.wait if stop is not None else time.sleep)(backoff.next())  # between tries
        log.warning("%s: %d replica(s) hold it now; going on", name, acked)

    def _fenced(self, name: str) -> int:
        """Write the fence key and WAIT for min_replicas: how many replicas hold every
        write made before it, by anyone."""
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.FENCE, name)
            pipe.execute_command(
                "WAIT", self.settings.min_replicas, self.settings.replica_timeout_ms
            )
            _, acked = pipe.execute()
        return acked

    # Producers

    def route(
        self, model: str, message: str, *, priority: int = 0, deadline: float | None = None
    ) -> str | None:
        """Enqueue one message by the two-level rule. Returns the executor id, or None for L1.
        Raises UnknownModel, QueueFull, Overloaded or BrokerUnavailable."""
        routed = routed_reply(
            model, self._route_chunk(model, [message], priority, deadline, [], one=True)
        )
        if isinstance(routed, Exception):
            raise routed
        return routed

    def route_many(
        self,
        model: str,
        messages: Sequence[str],
        *,
        priority: int = 0,
        deadline: float | None = None,
        chunk: int = ROUTE_CHUNK,
    ) -> list[str | None | QueueFull | Overloaded]:
        """Enqueue messages of one model and priority, each by the two-level rule, one
        script call (one round trip) per `chunk` of them. deadline: epoch s, for all of
        them; None takes the model's SLO, if it has one. One reply per message: the
        executor id, None for L1, or the QueueFull or Overloaded that refused it. Raises
        UnknownModel or BrokerUnavailable, with `.routed`: the replies of the earlier
        chunks, which were enqueued."""
        out: list[str | None | QueueFull | Overloaded] = []
        for start in range(0, len(messages), chunk):
            replies = self._route_chunk(
                model, messages[start : start + chunk], priority, deadline, out
            )
            out.extend(routed_reply(model, r) for r in replies)
        return out

    def _route_chunk(
        self,
        model: str,
        messages: Sequence[str],
        priority: int,
        deadline,
        routed: list,
        *,
        one: bool = False,
    ) -> list:
        """One route script call: its raw replies. routed: the replies of the chunks
        before, which an error raised here carries (see route_many). one: a single
        message, whose raw reply comes alone (route_one.lua)."""
        call = self.route_call(model, messages, priority, deadline)
        script = self.scripts.route_one if one else self.scripts.route
        try:
            return self._step("route", self._replicated, script, call)
        except NotReplicated as e:
            raise _partial(e, routed) from None
        except redis.ResponseError as e:
            _raise_converted(e, routed)
        except DISCONNECTS as e:
            raise _partial(BrokerUnavailable(f"cannot reach Redis: {e}"), routed) from e

    def _replicated(self, script, call: dict):
        """Run the route script (a route_call); with settings.min_replicas, also WAIT, in
        the same round trip on the same connection, for that many replicas to hold its
        writes. Raises NotReplicated if fewer did within replica_timeout_ms."""
        wanted = self.settings.min_replicas
        if not wanted:
            # Its keys and first six args are the same for every route of a model and
            # priority (_route_layout): packed once (DirectCalls.script's `same`).
            same = len(call["keys"]) + 6
            return self.direct.script(script, call["keys"], call["args"], same=same)
        with self.redis.pipeline(transaction=False) as pipe:
            script(**call, client=pipe)
            pipe.execute_command("WAIT", wanted, self.settings.replica_timeout_ms)
            reply, acked = pipe.execute()
        if acked < wanted:
            raise NotReplicated.of(acked, wanted, self.settings.replica_timeout_ms)
        return reply

    def route_on(
        self,
        pipe: redis.client.Pipeline,
        model: str,
        messages: Sequence[str],
        *,
        priority: int = 0,
        deadline: float | None = None,
    ) -> None:
        """Queue one route call for `messages` on a pipeline (see route.lua's reply)."""
        self.scripts.route(**self.route_call(model, messages, priority, deadline), client=pipe)

    @staticmethod
    def route_call(
        model: str, messages: Sequence[str | bytes], priority: int, deadline: float | None
    ) -> dict:
        script_keys, head = _route_layout(model, priority)
        # ms left, measured against the clock of this host just before the call; route.lua
        # counts them from its own clock, so hosts need not agree on the time.
        left_ms = -1 if deadline is None else max(0.0, (deadline - time.time()) * 1000)
        return {"keys": script_keys, "args": [*head[:6], left_ms, head[6], *messages]}

    def requeue(self, model: str, message: bytes, stored: bytes) -> str | None:
        """Route a dead letter's message again with a fresh delivery count and drop the
        letter, in one atomic step (requeue.lua). Returns the executor id, or None for L1.
        Raises UnknownModel, QueueFull or Overloaded (the letter stays), TandemError if
        the letter is gone, or BrokerUnavailable."""
        call = self.route_call(model, [message], 0, None)
        script_keys: list[str | bytes] = [keys.DEAD, keys.deliveries(message), *call["keys"]]
        try:
            (reply,) = self.scripts.requeue(keys=script_keys, args=[stored, *call["args"]])
        except redis.ResponseError as e:
            if str(e).startswith("NO_LETTER"):
                raise TandemError(str(e).removeprefix("NO_LETTER ")) from None
            _raise_converted(e)
        except DISCONNECTS as e:
            raise BrokerUnavailable(f"cannot reach Redis: {e}") from e
        routed = routed_reply(model, reply)
        if isinstance(routed, Exception):
            raise routed
        return routed

    def feed(self, model: str) -> int:
        """Hand tasks waiting in the model's L1 to its ready executors, as the route would
        have; returns how many. For tasks that skipped the route (plain Celery clients)."""
        script_keys = [keys.ready(model), *keys.l1_keys(model)]
        args = [keys.EXECUTOR_PREFIX, keys.L2_PREFIX, keys.FULL_PREFIX, keys.metrics(model)]
        return self.scripts.feed(keys=script_keys, args=args)

    # Executors

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
        script_keys = [
            keys.executor(executor_id),
            keys.executors(model),
            keys.MODELS,
            keys.STATE_STREAM,
            keys.STATS,
            keys.DEADLINES,
            keys.speed(model),
        ]
        args: list[Any] = [
            executor_id,
            model,
            worker,
            max_batch,
            ttl_ms,
            max_wait_ms,
            pid,
            max_queue,
            keys.MAX_QUEUE,
            keys.ready(model),
            slo_ms,
            keys.SLO,
        ]
        self._step("register", lambda: self.scripts.register(keys=script_keys, args=args))

    def publish_spec(self, model: str, spec: Mapping) -> None:
        """Publish the model's tensor signature (workers/models describe()) for gateways."""
        spec_json = json.dumps(spec, separators=(",", ":"))
        written(
            self.redis, keys.SPECS, "hash", lambda: self.redis.hset(keys.SPECS, model, spec_json)
        )

    def spec(self, model: str) -> dict | None:
        """The model's published tensor signature, or None."""
        raw = typed(keys.SPECS, None, lambda: self.redis.hget(keys.SPECS, model))
        try:
            return None if raw is None else json.loads(raw)
        except ValueError:
            once(f"{keys.SPECS} holds no JSON for {model!r}; read as none")
            return None

    def heartbeat(self, executor_ids: Sequence[str], ttl_ms: int) -> list[str]:
        """Refresh heartbeats; returns the ids that are no longer in the table."""
        if not executor_ids:
            return []
        missing = self.scripts.heartbeat(
            keys=[keys.DEADLINES, keys.MODELS, *(keys.executor(i) for i in executor_ids)],
            args=[ttl_ms, keys.EXECUTORS_PREFIX, *executor_ids],
        )
        return [executor_ids[i - 1] for i in missing]

    def begin(self, executor_id: str, model: str, *, room: int, taken: int) -> Batch:
        """Start a batch: take all of L2 and top up (an empty batch takes one retry task
        alone); go WORKING if anything is held."""
        script_keys = [
            keys.executor(executor_id),
            keys.l2(executor_id),
            keys.inflight(executor_id),
            keys.STATE_STREAM,
            *keys.claim_keys(model),
        ]
        args = [executor_id, room, taken, keys.metrics(model)]
        reply = self._call("begin", script_keys, args, holds=_claimed)
        return Batch.claimed(reply)

    def claim(self, executor_id: str, model: str, n: int, *, alone: bool = False) -> Batch:
        """Claim into in-flight: one retry task if `alone` (the batch is empty) and there is
        one, else up to n tasks from L1, oldest and highest priority first."""
        script_keys = [
            keys.executor(executor_id),
            keys.inflight(executor_id),
            *keys.claim_keys(model),
        ]
        reply = self._call("claim", script_keys, [n, "1" if alone else "0"], holds=_claimed)
        return Batch.claimed(reply)

    def claim_or_idle(self, executor_id: str, model: str, max_batch: int) -> Batch | None:
        """After a compute, one round trip: the next batch (one redelivered task alone, or
        up to max_batch from L1), or None when there was none and the executor went IDLE
        (or is STOPPING) in the same atomic step."""
        script_keys = [
            keys.executor(executor_id),
            keys.inflight(executor_id),
            keys.STATE_STREAM,
            *keys.claim_keys(model),
        ]
        args = [executor_id, max_batch, keys.metrics(model)]
        reply = self._call("claim_or_idle", script_keys, args, holds=_claimed)
        return None if reply[0] == 2 else Batch.claimed(reply)

    def unclaim(self, executor_id: str, model: str, raws: Sequence[bytes]) -> int:
        """Hand claimed, unstarted tasks back to the head of L1, in the order given."""
        script_keys = [keys.inflight(executor_id), *keys.l1_keys(model)]
        return self._call("unclaim", script_keys, list(raws))

    def set_state(self, executor_id: str, model: str, state: State) -> int:
        """Record WAITING or STOPPING; returns the executor's capacity after it."""
        script_keys = [keys.executor(executor_id), keys.STATE_STREAM, keys.speed(model)]
        return self._call("state", script_keys, [executor_id, state.value, keys.metrics(model)])

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
        counters: Mapping[str, float] | None = None,
        speed: Speed | None = None,
        count_later: bool = False,
    ) -> int:
        """Store results and drop their tasks from in-flight. Entries: (raw, result key,
        result JSON), or (raw, "", dead-letter record) for a message without a usable id.
        counters: the batch's metrics, added to the model's metrics hash in the same step.
        speed: the executor's latency model, published with them (needs `model`).
        count_later: the results alone; count_batch() adds the batch's bookkeeping after."""
        s = self.settings
        args: list = [s.result_expires_s, s.dead_letter_max, s.dead_letter_ttl_s]
        if count_later:
            args.extend(("", *NO_SPEED))
            counters = speed = None
        else:
            args.extend(_bookkeeping(counters, speed))
        same = len(args) if count_later else 3  # then the keys and these are the same each time
        for entry in entries:
            args.extend(entry)
        script_keys = _complete_keys(executor_id, model, speed is not None)
        # Alone (low load), the results go out with the producers woken before this
        # executor (DirectCalls.script's `publishes`): the executor's counts come after.
        return self._held(
            "complete",
            lambda then: self.direct.script(
                self.scripts.complete,
                script_keys,
                args,
                then=then,
                publishes=count_later,
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
        counters: Mapping[str, float] | None = None,
        speed: Speed | None = None,
    ) -> None:
        """A batch's bookkeeping, after complete(count_later=True) stored its results: its
        metrics counters, its tasks and itself in the executor's counts, and the latency
        model when given. Sent once: a lost reply may lose these counts, never double them."""
        script_keys = [
            keys.executor(executor_id),
            keys.metrics(model),
            *([keys.speed(model)] if speed is not None else []),
        ]
        args = [tasks, *_bookkeeping(counters, speed)]
        self._step(
            "count", lambda: self.direct.script(self.scripts.count, script_keys, args, once=True)
        )

    def reclaim(
        self, executor_id: str, model: str, *, force: bool = False, count: bool = False
    ) -> int:
        """Hand the executor's L2 and in-flight back and remove it; -1 if it is alive.

        count: it died or crashed holding its in-flight tasks, so each gets a delivery;
        they then go to the retry list, or at max_deliveries to the poison list.
        """
        script_keys = [
            keys.executor(executor_id),
            keys.executors(model),
            keys.l2(executor_id),
            keys.inflight(executor_id),
            keys.STATE_STREAM,
            keys.STATS,
            keys.retry(model),
            keys.POISON,
            *keys.l1_keys(model),
            keys.DEADLINES,
            keys.speed(model),
        ]
        args = [
            executor_id,
            "1" if force else "0",
            "1" if count else "0",
            self.settings.max_deliveries,
            keys.DELIVERIES_PREFIX,
            self.settings.result_expires_s,
            keys.metrics(model),
        ]
        return self._step("reclaim", lambda: self.scripts.reclaim(keys=script_keys, args=args))

    def bury(self, raw: bytes, record: str, task_id: str | None, meta: str) -> bool:
        """Quarantine one poison message: its FAILURE `meta` (if it has an id) and its
        dead-letter record. False if another coordinator buried it first."""
        s = self.settings
        script_keys = [keys.POISON, keys.DEAD, keys.deliveries(raw), keys.STATS]
        args: list = [raw, record, s.dead_letter_max, s.dead_letter_ttl_s]
        if task_id is not None:
            script_keys.append(keys.result(task_id))
            args += [meta, s.result_expires_s]
        return bool(self.scripts.bury(keys=script_keys, args=args))

    def lease(self, holder: str, ttl_ms: int) -> str:
        """Take, or keep for ttl_ms more, the coordinator's lease (ttl_ms 0 gives it up);
        returns who holds it now ("" for no one)."""
        reply = self.scripts.lease(keys=[keys.COORDINATOR], args=[holder, ttl_ms])
        return reply.decode() if isinstance(reply, bytes) else ""

    def _call(self, name: str, script_keys: list[str], args: list, *, holds=None):
        """Run an executor's script; holds: it takes custody (see _held)."""
        try:
            script = getattr(self.scripts, name)
            if holds is not None:
                # A claim is sent once: run twice after a lost reply, it would leave the
                # first run's tasks in flight with no one computing them. Raised, the
                # executor hands all it holds back and registers again.
                return self._held(
                    name,
                    lambda then: self.direct.script(
                        script, script_keys, args, once=True, then=then
                    ),
                    holds,
                )
            return self._step(name, lambda: self.direct.script(script, script_keys, args))
        except redis.ResponseError as e:
            if _gone(e):
                raise ExecutorGone(script_keys[0]) from e
            raise

    def reserved(self, executor_id: str) -> list[bytes]:
        """Every message in an executor's L2 and in-flight lists."""
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.lrange(keys.l2(executor_id), 0, -1)
            pipe.lrange(keys.inflight(executor_id), 0, -1)
            l2, inflight = pipe.execute()
        return [*l2, *inflight]


def _raise_converted(e: redis.ResponseError, routed: list | None = None) -> NoReturn:
    """Raise convert_error(e) (with `.routed`, if given). A refusal such as UnknownModel
    says it all: no Redis error is chained under it."""
    error = convert_error(e)
    if routed is not None and isinstance(error, TandemError):
        _partial(error, routed)
    raise error from (None if isinstance(error, UnknownModel) else e)


def convert_error(e: redis.ResponseError) -> TandemError | redis.ResponseError:
    text = str(e)
    if text.startswith("UNKNOWN_MODEL"):
        return UnknownModel(
            text.removeprefix("UNKNOWN_MODEL ") + "; start a worker with --model for it"
        )
    if refused := _REFUSED.search(text):
        return BrokerUnavailable(f"Redis refused the command: {refused.group(1)}")
    if isinstance(e, (redis.exceptions.ReadOnlyError, redis.exceptions.OutOfMemoryError)):
        return BrokerUnavailable(f"Redis refused the command: {type(e).__name__}: {text}")
    return e


#: Errors from a Redis that is up but refuses writes, also as a script reports them.
_REFUSED = re.compile(r"(?:^|-)((?:READONLY|OOM|LOADING|MASTERDOWN)\b.*)")


def _bookkeeping(counters: Mapping[str, float] | None, speed: Speed | None) -> list:
    """A batch's counters and latency model as complete.lua and count.lua take them."""
    counters = counters or {}
    args: list = [len(counters)]
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
