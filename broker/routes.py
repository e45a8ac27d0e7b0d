"""The producers' table: the two-level route (route.lua, route_one.lua) and the dead
letters' requeue (requeue.lua), over the script runner (broker/runner.py)."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence

import redis

from tandem.broker import keys
from tandem.broker.errors import (
    BrokerUnavailable,
    NotReplicated,
    Overloaded,
    QueueFull,
    TandemError,
)
from tandem.broker.retry import DISCONNECTS
from tandem.broker.runner import Runner, cut_short, raise_converted
from tandem.broker.scripts.layouts import RequeueArgs, RequeueKeys, RouteArgs, RouteKeys, pack

#: Messages per route script call: a burst is routed in calls of this many, so that
#: no single call holds Redis for long.
ROUTE_CHUNK = 256
#: route.lua's arguments before left_ms are the same for every route of a model and
#: priority: packed once (DirectCalls.script's `same`).
SAME_ARGS = RouteArgs._fields.index("left_ms")


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
def _route_layout(model: str, priority: int) -> tuple[tuple[str, ...], tuple, tuple]:
    """route.lua's keys for a model and priority, and its arguments before left_ms and
    between left_ms and the messages: built once per model and priority, not once per
    submit."""
    l1_keys = keys.l1_keys(model)
    target = keys.l1_for_priority(model, priority)
    script_keys = RouteKeys(
        ready_set=keys.ready(model),
        models=keys.MODELS,
        target=target,
        retry=keys.retry(model),
        speed=keys.speed(model),
        slo=keys.SLO,
        executors=keys.executors(model),
        l1=l1_keys,
    )
    args = RouteArgs(
        model=model,
        executor_prefix=keys.EXECUTOR_PREFIX,
        l2_prefix=keys.L2_PREFIX,
        max_queue_hash=keys.MAX_QUEUE,
        metrics=keys.metrics(model),
        full_prefix=keys.FULL_PREFIX,
        left_ms=-1,
        above=l1_keys.index(target) + 1,
        messages=(),
    )
    packed = pack(args)
    return tuple(pack(script_keys)), tuple(packed[:SAME_ARGS]), tuple(packed[SAME_ARGS + 1 :])


class Routes(Runner):
    """What producers call: the route, one message or a burst, and the requeue of a
    dead letter."""

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
            raise cut_short(e, routed) from None
        except redis.ResponseError as e:
            raise_converted(e, routed)
        except DISCONNECTS as e:
            raise cut_short(BrokerUnavailable(f"cannot reach Redis: {e}"), routed) from e

    def _replicated(self, script, call: dict):
        """Run the route script (a route_call); with settings.min_replicas, also WAIT, in
        the same round trip on the same connection, for that many replicas to hold its
        writes. Raises NotReplicated if fewer did within replica_timeout_ms."""
        wanted = self.settings.min_replicas
        if not wanted:
            same = len(call["keys"]) + SAME_ARGS  # as for every route of the model
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
    @staticmethod
    def route_call(
        model: str, messages: Sequence[str | bytes], priority: int, deadline: float | None
    ) -> dict:
        """route.lua's keys and args for these messages, as a script call takes them."""
        script_keys, before, after = _route_layout(model, priority)
        # ms left, measured against the clock of this host just before the call; route.lua
        # counts them from its own clock, so hosts need not agree on the time.
        left_ms = -1 if deadline is None else max(0.0, (deadline - time.time()) * 1000)
        return {"keys": script_keys, "args": [*before, left_ms, *after, *messages]}

    def requeue(self, model: str, message: bytes, stored: bytes) -> str | None:
        """Route a dead letter's message again with a fresh delivery count and drop the
        letter, in one atomic step (requeue.lua). Returns the executor id, or None for L1.
        Raises UnknownModel, QueueFull or Overloaded (the letter stays), TandemError if
        the letter is gone, or BrokerUnavailable."""
        call = self.route_call(model, [message], 0, None)
        script_keys = RequeueKeys(
            dead=keys.DEAD, deliveries=keys.deliveries(message), route_keys=call["keys"]
        )
        args = RequeueArgs(letter=stored, route_args=call["args"])
        try:
            (reply,) = self.scripts.requeue(keys=pack(script_keys), args=pack(args))
        except redis.ResponseError as e:
            if str(e).startswith("NO_LETTER"):
                raise TandemError(str(e).removeprefix("NO_LETTER ")) from None
            raise_converted(e)
        except DISCONNECTS as e:
            raise BrokerUnavailable(f"cannot reach Redis: {e}") from e
        routed = routed_reply(model, reply)
        if isinstance(routed, Exception):
            raise routed
        return routed
