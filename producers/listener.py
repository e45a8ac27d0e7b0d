"""One result listener per Client: every result of its tasks, pushed as it is stored.

A Client's task ids begin with its token (`<token>-xxxx-4xxx-...`, still UUID-shaped),
and the listener subscribes once to the pattern `celery-task-meta-<token>-*` on a
connection of its own, before the Client's first submit. So no task needs a SUBSCRIBE,
a GET or an UNSUBSCRIBE of its own, and a result stored before get() is called is kept
for it.

The listener has no thread. A get() that finds nobody reading the subscription reads it
itself, blocked on its socket, and hands each result that comes to its task's waiter
until its own has come; other get()s meanwhile wait on a condition that each delivery
and the reader's leaving wake (leader and followers). So the caller that waits is the
one that wakes: no hop to another thread, and never a sleep loop. Results nobody waits
for yet stay in the socket until a get() reads them.

If the connection drops, redis-py reconnects at the next read and subscribes again;
when Redis confirms the subscription again, the listener reads the result keys of every
task still waiting, so a result published while it was away is not lost.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Any

import redis
from celery import states

from tandem.broker import keys
from tandem.broker.ids import new_uuid

log = logging.getLogger("tandem.producers")

#: Seconds a reading get() blocks on the socket at most before it looks at its deadline.
READ_S = 1.0
#: Seconds a reader waits after a Redis error before it reads again.
ERROR_WAIT_S = 0.1


class Waiter:
    """One task's result, once it arrives: its decoded meta. (No __init__: one fewer
    function to run, cold, per submit.)"""

    meta: dict | None = None


class ResultListener:
    def __init__(self, client: redis.Redis, decode) -> None:
        """client: the Redis client whose pool the subscription's connection comes from;
        decode: result bytes -> meta dict (kombu's JSON decoder, which Celery's backend
        uses for the JSON that tandem's workers store)."""
        self.token = secrets.token_hex(4)
        self.pattern = f"{keys.RESULT_PREFIX}{self.token}-*"
        self._redis = client
        self._decode = decode
        self._waiters: dict[str, Waiter] = {}
        # _lock guards _waiters, _reader and _followers; _changed is its condition. It is
        # taken as _lock, whose `with` runs no Python code (a Condition's does).
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._reader = False  # a get() is reading the subscription
        self._followers = 0  # get()s waiting on _changed for the reader
        self._pubsub: Any = None
        self._direct = False  # reading the subscription's connection directly (_next)
        self.delivered = 0
        self.closed = False

    def __repr__(self) -> str:
        waiting = len(self._waiters)
        return f"<ResultListener {self.pattern} waiting={waiting} delivered={self.delivered}>"

    def new_id(self) -> str:
        """A task id this listener hears: the token, then the rest of a random UUID."""
        return self.token + new_uuid()[8:]

    def hears(self, task_id: str) -> bool:
        return task_id.startswith(self.token + "-")

    def expect(self, task_ids: list[str]) -> None:
        """Keep these tasks' results (call it before they are routed). Subscribes, and
        waits for Redis to confirm it, on first use."""
        with self._lock:
            if self._pubsub is None:
                self._subscribe()
            for task_id in task_ids:
                self._waiters.setdefault(task_id, Waiter())

    def expects(self, task_id: str) -> bool:
        with self._lock:
            return task_id in self._waiters

    def release(self, task_id: str) -> None:
        """Forget the task: its result object is gone, or was forgotten."""
        with self._lock:
            self._waiters.pop(task_id, None)

    def wait(self, task_id: str, timeout: float | None) -> dict | None:
        """The task's decoded result meta; None after timeout seconds, once closed, or
        for a task it does not expect."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            waiter = self._waiters.get(task_id)
            while waiter is not None and waiter.meta is None and not self.closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                if self._reader:  # a follower: woken by each delivery and by the reader
                    self._followers += 1
                    try:
                        self._changed.wait(left)
                    finally:
                        self._followers -= 1
                    continue
                self._reader = True
                self._lock.release()
                try:
                    self._read(min(READ_S, left) if left is not None else READ_S)
                finally:
                    self._lock.acquire()
                    self._reader = False
                    if self._followers:
                        self._changed.notify_all()  # a follower may read now
                    if self.closed:
                        self._pubsub.close()
        return None if waiter is None else waiter.meta

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._changed.notify_all()
            if self._pubsub is not None and not self._reader:
                self._pubsub.close()

    # Reading, by one get() at a time

    def _subscribe(self) -> None:
        """Subscribe, confirmed by Redis before this returns."""
        pubsub = self._redis.pubsub(ignore_subscribe_messages=False)
        try:
            pubsub.psubscribe(self.pattern)
            while True:
                reply = pubsub.get_message(timeout=5.0)
                if reply is None:
                    raise redis.ConnectionError(f"no confirmation of PSUBSCRIBE {self.pattern}")
                if reply["type"] == "psubscribe":
                    break
        except BaseException:
            pubsub.close()
            raise
        self._pubsub = pubsub

    def _read(self, timeout: float) -> None:
        """Read and deliver one message, waiting up to timeout seconds for it."""
        try:
            reply = self._next(timeout)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
            # redis-py reconnects at the next read and subscribes again (see _catch_up).
            log.warning("result listener %s: %s; reconnecting", self.token, e)
            time.sleep(ERROR_WAIT_S)  # backoff before the next read, not synchronisation
            return
        if reply is None:
            return
        if reply["type"] == "pmessage":
            self._deliver(reply["channel"], reply["data"])
        elif reply["type"] == "psubscribe":
            self._catch_up()  # subscribed again after a reconnect

    def _next(self, timeout: float) -> dict | None:
        """The next message, or None after timeout seconds. A result is read off the
        connection directly, as PubSub.get_message would read it, without the layers
        around it (its checks, retry wrapper and observability hooks, which cost more
        than the read when run cold); anything else is handed to PubSub as read. While
        a health check is due, after an error, and on RESP3, get_message reads instead:
        it checks, reconnects and subscribes again."""
        connection = self._pubsub.connection
        due = (
            connection is not None
            and connection.health_check_interval
            and (time.monotonic() > connection.next_health_check)
        )
        if not self._direct or due or connection is None or str(connection.protocol) == "3":
            reply = self._pubsub.get_message(timeout=timeout)
            self._direct = True
            return reply
        try:
            raw = connection.read_response(timeout=timeout, disconnect_on_error=False)
        except redis.TimeoutError:
            return None  # nothing came; a message cut short stays in the parser's buffer
        except BaseException:
            self._direct = False
            raise
        if isinstance(raw, list) and len(raw) == 4 and raw[0] == b"pmessage":
            return {"type": "pmessage", "pattern": raw[1], "channel": raw[2], "data": raw[3]}
        return self._pubsub.handle_message(raw)

    def _deliver(self, channel: bytes, data: bytes) -> None:
        """Hand a published result to its task's waiter. Anything else published on the
        channel (bytes that are not a result, a state that is not final) is passed over:
        the waiter keeps waiting for the stored result."""
        task_id = channel.decode(errors="replace")[len(keys.RESULT_PREFIX) :]
        with self._lock:
            waiter = self._waiters.get(task_id)
            if waiter is None or waiter.meta is not None:
                return
        try:
            meta = self._decode(data)
            final = isinstance(meta, dict) and meta.get("status") in states.READY_STATES
        except Exception:  # noqa: BLE001 - any bytes at all may be published there
            final = False
        if not final:
            log.warning("result listener %s: passed over a message for %s that is not a "
                        "final result", self.token, task_id)  # fmt: skip
            return
        with self._lock:
            waiter.meta = meta
            self.delivered += 1
            if self._followers:
                self._changed.notify_all()

    def _catch_up(self) -> None:
        """Subscribed again (Redis confirmed it): read what was stored while the
        connection was down, for every task still waiting."""
        with self._lock:
            waiting = [t for t, w in self._waiters.items() if w.meta is None]
        for start in range(0, len(waiting), 1000):
            chunk = waiting[start : start + 1000]
            stored: list[bytes | None] = self._redis.mget([keys.result(t) for t in chunk])  # type: ignore[assignment]
            for task_id, data in zip(chunk, stored, strict=True):
                if data is not None:
                    self._deliver(keys.result(task_id).encode(), data)
