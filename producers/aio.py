"""An asyncio producer: the same atomic route as Client, results awaited on one pattern
subscription per process.

    async with AsyncClient(settings) as client:
        futures = await client.submit_many("sim:1", [[1, 2], [3, 4]])
        metas = [await f for f in futures]  # Celery's result metas, as stored

Task ids begin with the client's token, so one PSUBSCRIBE to
`celery-task-meta-<token>-*` hears every result; one reader task hands each to its
future. No thread and no polling per task. If the connection drops, redis-py
reconnects and subscribes again, and once Redis confirms it the reader reads the stored
results of every task still waiting (as producers/listener.py does).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import random
import secrets
import socket
import time
import weakref
from collections.abc import Sequence
from typing import Any

import redis
from celery import states

from tandem.broker import keys, message, reads, revocations, tracing
from tandem.broker.connect import connect_async
from tandem.broker.errors import (
    BadArgument,
    BrokerUnavailable,
    NotReplicated,
    UnknownModel,
)
from tandem.broker.routes import ROUTE_CHUNK, Routes, routed_reply
from tandem.broker.runner import convert_error
from tandem.broker.scripts import source
from tandem.broker.settings import Settings

log = logging.getLogger("tandem.producers")

#: How long what the client read about a model (live executors, its latest version, its
#: signature and SLO) is kept, in seconds.
MODEL_TTL_S = 1.0
#: The first word of Redis's confirmation of PSUBSCRIBE, and of a message on the pattern.
SUBSCRIBED = (b"psubscribe", "psubscribe")
PUBLISHED = (b"pmessage", "pmessage")


def _drop(waiting: dict, task_id: str, _future: asyncio.Future) -> None:
    """A done future's callback: forget the task's waiter."""
    waiting.pop(task_id, None)


class AsyncClient:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.redis = connect_async(
            settings.redis_url, settings.sentinel_master, health_check_interval=10
        )
        self._route = self.redis.register_script(source("route"))
        self.token = secrets.token_hex(4)
        self._random = random.Random(secrets.randbits(128))
        self.pattern = f"{keys.RESULT_PREFIX}{self.token}-*"
        self._waiting: dict[str, asyncio.Future] = {}
        self._conn: Any = None  # the subscribed connection
        self._reader: asyncio.Task | None = None
        self._models: dict[str, tuple[float, Any]] = {}  # cache key: (when read, value)
        self._joining: dict[tuple, list] = {}  # (model, priority, deadline_s): submits
        self._revoking: set[asyncio.Task] = set()  # revocations under way
        #: Each future's task id, for as long as its caller holds the future: a cancelled
        #: wait cancels its future, which leaves _waiting at once, before revoke_soon.
        self._ids: weakref.WeakKeyDictionary[asyncio.Future, str] = weakref.WeakKeyDictionary()
        #: OpenTelemetry's tracer, when this process traces (a send span per submit_many).
        self.tracer = tracing.tracer("tandem-gateway")

    async def __aenter__(self) -> AsyncClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Subscribe, confirmed by Redis, and start the reader."""
        self._conn = await self._subscribe()
        self._reader = asyncio.create_task(self._read(), name="tandem-results")

    async def _subscribe(self):
        """A connection of its own, PSUBSCRIBEd, confirmed by Redis. Kernel keepalives
        find a peer gone quiet (the reader blocks without a timeout of its own)."""
        pool = self.redis.connection_pool
        options = {
            **pool.connection_kwargs, "socket_keepalive": True, "client_name": "tandem-results"
        }  # fmt: skip
        if hasattr(socket, "TCP_KEEPIDLE"):
            options["socket_keepalive_options"] = {
                socket.TCP_KEEPIDLE: 10, socket.TCP_KEEPINTVL: 5, socket.TCP_KEEPCNT: 3
            }  # fmt: skip
        conn = pool.connection_class(**options)
        try:
            await conn.connect()
            await conn.send_command("PSUBSCRIBE", self.pattern)
            reply = await conn.read_response(timeout=5.0, push_request=True)
            if not (
                isinstance(reply, list) and reply and reply[0] in (b"psubscribe", "psubscribe")
            ):
                raise BrokerUnavailable(f"no confirmation of PSUBSCRIBE {self.pattern}: {reply!r}")
        except BaseException:
            await conn.disconnect()
            raise
        return conn

    @property
    def reading(self) -> bool:
        """True while the result reader runs."""
        return self._reader is not None and not self._reader.done()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._conn is not None:
            await self._conn.disconnect()
        for future in self._waiting.values():
            future.cancel()
        await self.redis.aclose()

    # Submitting

    async def submit_many(
        self,
        model: str,
        inputs: Sequence[Any],
        *,
        priority: int = 0,
        deadline_s: float | None = None,
        binary: bool = False,
    ) -> list[asyncio.Future | Exception]:
        """Enqueue tasks of one model, each by the atomic route, in one round trip. One
        entry per input: a future of its stored result meta, or the QueueFull or
        Overloaded that refused it. Raises BadInput, UnknownModel or BrokerUnavailable
        (then nothing was enqueued)."""
        if not 0 <= priority <= 9:
            raise BadArgument(f"priority must be 0-9, got {priority}")
        expires = message.expires_in(deadline_s)
        queue = keys.l1(model)
        send = None
        if self.tracer is not None:
            from tandem.producers.tracing import Send

            send = Send(self.tracer, model, queue, len(inputs))
        ids, envelopes = [], []
        limit = self.settings.max_message_bytes
        trace = None if send is None else send.headers
        try:
            for value in inputs:
                task_id = self._new_id()
                envelope = message.encode_checked(
                    model, value, queue=queue, task_id=task_id, priority=priority,
                    expires=expires, binary=binary, limit=limit, trace=trace,
                )  # fmt: skip
                ids.append(task_id)
                envelopes.append(envelope)
        except BaseException as e:
            if send is not None:
                send.failed(e)
            raise
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in ids]
        self._waiting.update(zip(ids, futures, strict=True))
        try:
            replies = await self._route_joined((model, priority, deadline_s), envelopes)
        except BaseException as e:
            self._forget(ids)
            if send is not None:
                send.failed(e)
            raise
        out: list[asyncio.Future | Exception] = []
        routes = []
        for task_id, future, reply in zip(ids, futures, replies, strict=True):
            routed = routed_reply(model, reply)
            routes.append(routed)
            if isinstance(routed, Exception):
                self._forget([task_id])
                out.append(routed)
            else:
                future.add_done_callback(functools.partial(_drop, self._waiting, task_id))
                self._ids[future] = task_id
                out.append(future)
        if send is not None:
            send.routed(ids, routes)
        return out

    async def _route_joined(self, key: tuple, envelopes: list[str]) -> list:
        """route.lua's replies for these messages. The submits of one event-loop turn
        with the same model, priority and deadline share script calls (up to ROUTE_CHUNK
        messages each): the first of them waits one turn for the others, then routes
        them all, so a busy gateway makes a round trip per turn, not per request."""
        loop = asyncio.get_running_loop()
        mine = loop.create_future()
        joined = self._joining.get(key)
        if joined is not None:
            joined.append((envelopes, mine))
            return await mine
        joined = self._joining[key] = [(envelopes, mine)]
        await asyncio.sleep(0)  # one loop turn: the submits made in it join this call
        del self._joining[key]
        await self._route_all(key, joined)
        return mine.result()

    async def _route_replicated(self, call: dict) -> list:
        """route.lua's replies; with min_replicas, WAITed for as Routes._replicated does."""
        wanted = self.settings.min_replicas
        if not wanted:
            return await self._route(keys=call["keys"], args=call["args"])
        async with self.redis.pipeline(transaction=False) as pipe:
            await self._route(keys=call["keys"], args=call["args"], client=pipe)
            pipe.execute_command("WAIT", wanted, self.settings.replica_timeout_ms)
            replies, acked = await pipe.execute()
        if acked < wanted:
            raise NotReplicated.of(acked, wanted, self.settings.replica_timeout_ms)
        return replies

    async def _route_all(self, key: tuple, joined: list) -> None:
        """Route every joined submit's messages; settle each one's future."""
        model, priority, deadline_s = key
        deadline = None if deadline_s is None else time.time() + deadline_s
        messages = [e for envelopes, _ in joined for e in envelopes]
        replies: list = []
        error: BaseException | None = None
        try:
            for start in range(0, len(messages), ROUTE_CHUNK):
                call = Routes.route_call(
                    model, messages[start : start + ROUTE_CHUNK], priority, deadline
                )
                replies += await self._route_replicated(call)
        except NotReplicated as e:
            error = e
        except redis.ResponseError as e:
            error = convert_error(e)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
            error = BrokerUnavailable(f"cannot reach Redis: {e}")
        except BaseException as e:
            error = e
        n = 0
        for envelopes, future in joined:
            end = n + len(envelopes)
            if end <= len(replies):
                future.set_result(replies[n:end])
            else:  # a later chunk failed: these were not all routed
                future.set_exception(error)
            n = end
        if error is not None and not isinstance(error, Exception):
            raise error  # cancelled: the joined submits have their error, this one too

    def _new_id(self) -> str:
        """A task id this client hears: its token, then 96 random bits in a version-4 UUID's
        shape, from a generator seeded once from os.urandom (no system call per id)."""
        bits = self._random.getrandbits(96)
        rest = f"{bits:024x}"
        return f"{self.token}-{rest[:4]}-4{rest[4:7]}-{'89ab'[bits & 3]}{rest[7:10]}-{rest[10:22]}"

    def _forget(self, task_ids: list[str]) -> None:
        for task_id in task_ids:
            future = self._waiting.pop(task_id, None)
            if future is not None and not future.done():
                future.cancel()

    # Revoking

    async def revoke(self, task_ids: Sequence[str]) -> None:
        """Record the tasks revoked in Redis, as Client.revoke does: a task not yet
        computing is never computed, and its result is REVOKED."""
        if task_ids:
            await revocations.record(self.redis, task_ids, self.settings.result_expires_s)

    def revoke_soon(self, futures: Sequence[asyncio.Future]) -> None:
        """Revoke the tasks of these futures (from submit_many), in a task of its own:
        the caller is being cancelled, and its futures with it. A failure is logged; the
        tasks then run for nobody."""
        ids = [self._ids[f] for f in futures if f in self._ids]
        if ids:
            task = asyncio.get_running_loop().create_task(self._revoke_logged(ids))
            self._revoking.add(task)
            task.add_done_callback(self._revoking.discard)

    async def _revoke_logged(self, task_ids: list[str]) -> None:
        try:
            await self.revoke(task_ids)
        except Exception as e:  # noqa: BLE001 - the caller is gone; say so and go on
            log.warning("could not revoke %d tasks of a cancelled call: %s", len(task_ids), e)

    # What the gateway asks about models

    async def _cached(self, key: str, read) -> Any:
        now = time.monotonic()
        hit = self._models.get(key)
        if hit is not None and now - hit[0] < MODEL_TTL_S:
            return hit[1]
        try:
            value = await read()
        except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
            raise BrokerUnavailable(f"cannot reach Redis: {e}") from e
        self._models[key] = (now, value)
        return value

    async def live(self, model: str) -> bool:
        """True while an executor of the model has a heartbeat that has not lapsed."""
        return await self._cached("live " + model, lambda: reads.live(self.redis, model))

    async def resolve(self, name: str, version: str | None) -> str:
        """NAME:VERSION; without a version (or `latest`), the highest version with a live
        executor, else (none live) the highest one ever served, as Table.latest. Raises
        UnknownModel if none ever was, also for a malformed name."""
        try:
            keys.parse_model(f"{name}:{version or 'latest'}")
        except ValueError as e:
            raise UnknownModel(str(e)) from None
        if version and version != "latest":
            return f"{name}:{version}"
        served = await self._cached("versions " + name, lambda: reads.versions(self.redis, name))
        live = [m for m in served if await self.live(m)]
        if not (live or served):
            raise UnknownModel(f"no worker has served any version of {name!r}")
        return max(live or served, key=lambda m: keys.version_key(m.partition(":")[2]))

    async def spec(self, model: str) -> dict | None:
        """The signature the model's workers published, with its slo_ms; None if no
        worker ever served it."""
        return await self._cached("spec " + model, lambda: reads.signature(self.redis, model))

    # The reader

    async def _read(self) -> None:
        """Hand each result to its future; after a lost connection, subscribe again
        (retrying) and read what was stored meanwhile."""
        while True:
            try:
                reply = await self._conn.read_response(timeout=math.inf, push_request=True)
            except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
                log.warning("results %s: %s; subscribing again", self.token, e)
                await self._conn.disconnect()
                self._conn = await self._subscribe_again()
                await self._catch_up()
                continue
            if (
                isinstance(reply, list)
                and len(reply) == 4
                and reply[0] in (b"pmessage", "pmessage")
            ):
                self._deliver(reply[2], reply[3])

    async def _subscribe_again(self):
        while True:
            try:
                return await self._subscribe()
            except (redis.RedisError, BrokerUnavailable, OSError) as e:
                log.warning("results %s: cannot subscribe (%s); retrying", self.token, e)
                await asyncio.sleep(0.1)  # backoff before the next try

    def _deliver(self, channel: bytes, data: bytes) -> None:
        task_id = channel.decode(errors="replace")[len(keys.RESULT_PREFIX) :]
        future = self._waiting.get(task_id)
        if future is None or future.done():
            return
        try:
            meta = json.loads(data)  # Celery's result meta; tandem's results are JSON
            final = isinstance(meta, dict) and meta.get("status") in states.READY_STATES
        except Exception:  # noqa: BLE001 - any bytes at all may be published there
            final = False
        if final:
            future.set_result(meta)

    async def _catch_up(self) -> None:
        waiting = [t for t, f in self._waiting.items() if not f.done()]
        for start in range(0, len(waiting), 1000):
            chunk = waiting[start : start + 1000]
            try:
                stored = await self.redis.mget([keys.result(t) for t in chunk])
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                return  # the next confirmation catches up again
            for task_id, data in zip(chunk, stored, strict=True):
                if data is not None:
                    self._deliver(keys.result(task_id).encode(), data)
