"""The producer client: one atomic route-and-enqueue per task, Celery results back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import redis
from celery.app import app_or_default
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import AsyncResult, assert_will_not_block
from vine import promise

from tandem.broker import keys, message
from tandem.broker.app import make_app
from tandem.broker.connect import connect
from tandem.broker.discovery import joined_settings
from tandem.broker.errors import BadArgument, BrokerUnavailable, TandemError, UnknownModel
from tandem.broker.results import loads as load_result
from tandem.broker.retry import unavailable_as_tandem
from tandem.broker.settings import Settings
from tandem.broker.table import Table
from tandem.producers.listener import ResultListener

#: How long a Client keeps what NAME:latest resolved to, in seconds: a newer version that
#: comes up is used within this long.
LATEST_TTL_S = 1.0


class TandemResult(AsyncResult):
    """A Celery AsyncResult that also says where the task was routed. Its get() waits on
    its Client's result listener, which has the result pushed as it is stored; every
    other method is Celery's.

    get() caches the result without firing the on_ready promise until something waits on
    it (then(), as a ResultSet does): a fired promise holds its result in a reference
    cycle, which only the garbage collector frees, and one collection every few dozen
    tasks put its pause on the tasks' own path. So a result nobody holds is freed at once.
    The promise itself is made on first use: a weak promise costs more to make, on the
    submit's path, than the rest of the result.
    """

    app: Any = None  # Celery's class attribute, untyped there
    #: then() was called: the on_ready promise has a callback to fire.
    _awaited = False

    def __init__(
        self,
        task_id: str,
        *,
        executor: str | None = None,
        listener: ResultListener | None = None,
        app: Any = None,
        backend: Any = None,
        parent: AsyncResult | None = None,
    ) -> None:
        # AsyncResult.__init__, but for its on_ready promise (the property below).
        if task_id is None:
            raise ValueError(f"AsyncResult requires valid id, not {type(task_id)}")
        self.app = app or app_or_default(self.app)
        self.id = task_id
        self.backend = backend or self.app.backend
        self.parent = parent
        self._cache = None
        self._ignored = False
        #: The executor whose L2 took the task, or None when it waits in L1.
        self.executor = executor
        self._listener = listener

    @property
    def on_ready(self) -> promise:
        """AsyncResult's on_ready promise, made on first use."""
        ready = self.__dict__.get("_on_ready")
        if ready is None:
            ready = self._on_ready = promise(self._on_fulfilled, weak=True)
        return ready

    @on_ready.setter
    def on_ready(self, value: promise) -> None:
        self._on_ready = value

    def __del__(self) -> None:
        """Its Client stops keeping its task's result (a finalizer that costs nothing
        until it runs)."""
        listener = self.__dict__.get("_listener")
        if listener is not None:
            listener.release(self.id)

    def get(
        self,
        timeout: float | None = None,
        propagate: bool = True,
        interval: float = 0.5,
        no_ack: bool = True,
        follow_parents: bool = True,
        callback=None,
        on_message=None,
        on_interval=None,
        disable_sync_subtasks: bool = True,
        **kwargs: Any,
    ) -> Any:
        """As AsyncResult.get: the result, the task's error raised, or Celery's
        TimeoutError after timeout seconds."""
        listener = self._listener
        if listener is None or on_message is not None or on_interval is not None or self.parent:
            return super().get(
                timeout, propagate, interval, no_ack, follow_parents, callback, on_message,
                on_interval, disable_sync_subtasks, **kwargs,
            )  # fmt: skip
        if disable_sync_subtasks:
            assert_will_not_block()
        if self._cache is None:
            meta = listener.wait(self.id, timeout)
            if meta is None:
                if listener.closed or not listener.expects(self.id):
                    # Its Client was closed, or it was forgotten: ask Redis as Celery does.
                    return super().get(timeout, propagate, interval, no_ack, follow_parents)
                raise CeleryTimeoutError("The operation timed out.")
            self._settle(meta)
        return self.maybe_throw(propagate=propagate, callback=callback)

    def then(self, callback, on_error=None, weak: bool = False):
        """As AsyncResult.then: the callback is called with this result once it is ready."""
        self._awaited = True
        promised = super().then(callback, on_error, weak)
        if self._cache is not None and not self.on_ready.ready:
            self.on_ready(self)  # get() had it already: call back at once
        return promised

    def _settle(self, meta: dict) -> None:
        """Cache a final result, as Celery's _maybe_set_cache does; its on_ready promise
        fires only if then() was called (see the class)."""
        self._set_cache(self.backend.meta_from_decoded(meta))
        if self._awaited and not self.on_ready.ready:
            self.on_ready(self)

    def forget(self) -> None:
        if self._listener is not None:
            self._listener.release(self.id)
        super().forget()

    @property
    def route(self) -> str:
        """'L2' or 'L1'."""
        return "L2" if self.executor else "L1"

    def __repr__(self) -> str:
        return f"<TandemResult {self.id} route={self.route} executor={self.executor}>"


class Client:
    """Submit tasks to tandem. Thread-safe for submit; get() follows Celery's rules."""

    def __init__(self, redis_url: str | None = None, *, settings: Settings | None = None) -> None:
        """redis_url: else TANDEM_REDIS_URL, else the Redis of a `tandem up` running in the
        current folder (its .tandem/stack.json), else redis://localhost:6379/0."""
        note = ""
        if settings is None:
            settings, note = joined_settings(redis_url=redis_url)
        self.settings = settings
        #: How the Redis tried was chosen, when it was the default: said with every
        #: BrokerUnavailable that submit raises.
        self.url_note = note
        self.redis = connect(
            self.settings.redis_url, self.settings.sentinel_master, health_check_interval=10
        )
        self.table = Table(self.redis, self.settings)
        self.app = make_app(self.settings)
        #: Every result of this client's tasks, pushed to it as it is stored.
        self.listener = ResultListener(self.redis, load_result)
        self.submitted = 0
        self.to_l2 = 0
        self._latest: dict[str, tuple[str, float]] = {}  # name: (NAME:VERSION, when read)
        #: NAME:VERSION models resolve() has checked: their L1 queues.
        self._concrete: dict[str, str] = {}
        self._dispatcher: Any = None  # task-sent events, made on first use
        self._events_lock = threading.Lock()
        self._local = threading.local()  # this thread's result backend (_result)

    def __repr__(self) -> str:
        return f"<Client submitted={self.submitted} to_l2={self.to_l2}>"

    def submit(
        self,
        model: str,
        inputs: Any,
        *,
        priority: int = 0,
        deadline_s: float | None = None,
        task_id: str | None = None,
        binary: bool | None = None,
    ) -> TandemResult:
        """Enqueue one task. Raises UnknownModel, BadInput, QueueFull, Overloaded or
        BrokerUnavailable.

        model: NAME:VERSION; NAME:latest picks the highest version with a live executor.
        priority: 0 (served first) to 9, as kombu's Redis transport orders them.
        deadline_s: seconds from now after which the answer is worth nothing: the task
            fails unrun (DeadlineExceeded) if it would finish later, and submit raises
            Overloaded at once if the predicted wait already passes it. None takes the
            model's SLO (slo_ms), if it has one.
        binary: send the tensor payload instead of JSON; by default, when inputs hold
            torch tensors or numpy arrays.
        """
        # Each call skipped below costs more cold than its test: this runs once per task.
        if model not in self._concrete:
            model = self.resolve(model)
        task_id_given = task_id is not None
        expires = None if deadline_s is None else message.expires_in(deadline_s)
        task_id, envelope = self._encode(model, inputs, priority, expires, task_id, binary)
        self._expect([task_id], own=not task_id_given)
        try:
            executor = self.table.route(
                model,
                envelope,
                priority=priority,
                deadline=expires.timestamp() if expires else None,
            )
        except Exception as e:
            self.listener.release(task_id)  # never enqueued: no result will come
            self._explain(e)
            raise
        result = self._result(task_id, executor, own=not task_id_given)
        if self.settings.send_sent_event:
            self._sent(model, [result], expires)
        return result

    def submit_many(
        self,
        model: str,
        inputs: Iterable[Any],
        *,
        priority: int = 0,
        deadline_s: float | None = None,
        binary: bool | None = None,
    ) -> list[TandemResult]:
        """Enqueue many tasks, each routed by the same atomic rule, one round trip per
        256 of them.

        If some are refused (QueueFull, Overloaded), the first error is raised after the
        others were enqueued; the accepted ones are on the error as `.accepted`. So are
        those enqueued before a BrokerUnavailable cut a large burst short.
        """
        model = self.resolve(model)
        expires = message.expires_in(deadline_s)
        encoded = [self._encode(model, x, priority, expires, None, binary) for x in inputs]
        self._expect([task_id for task_id, _ in encoded])
        envelopes = [envelope for _, envelope in encoded]
        try:
            replies = self.table.route_many(
                model, envelopes, priority=priority, deadline=_epoch(expires)
            )
        except (BrokerUnavailable, UnknownModel) as e:
            e.accepted = self._accepted(model, encoded, e.routed, expires)[0]
            self._explain(e)
            raise
        except Exception:
            self._accepted(model, encoded, [], expires)  # releases them all
            raise
        results, errors = self._accepted(model, encoded, replies, expires)
        if errors:
            errors[0].accepted = results
            raise errors[0]
        return results

    def _accepted(
        self,
        model: str,
        encoded: list[tuple[str, str]],
        replies: Sequence,
        expires: datetime | None,
    ) -> tuple[list[TandemResult], list[TandemError]]:
        """The results of the routed tasks, and the errors of the refused ones."""
        results: list[TandemResult] = []
        errors: list[TandemError] = []
        for n, (task_id, _) in enumerate(encoded):
            if n >= len(replies) or isinstance(replies[n], Exception):
                self.listener.release(task_id)  # never enqueued: no result will come
                if n < len(replies):
                    errors.append(replies[n])
            else:
                results.append(self._result(task_id, replies[n]))
        self._sent(model, results, expires)
        return results, errors

    def _explain(self, error: Exception) -> None:
        """Add to a BrokerUnavailable how its Redis was chosen, when it was the default."""
        if isinstance(error, BrokerUnavailable) and self.url_note not in str(error):
            error.args = (f"{error}; {self.url_note}", *error.args[1:])

    def revoke(self, task_id: str) -> None:
        """Revoke a task, as Celery's revoke does, and record it in Redis for every executor,
        including those started later. A task not yet computing is never computed; one
        computing finishes, but its result stays REVOKED."""
        with unavailable_as_tandem():
            self.table.revoke([task_id], self.settings.result_expires_s)
            self.app.backend.mark_as_revoked(task_id, reason="revoked")
            self.app.control.revoke(task_id)

    def _sent(self, model: str, results: list[TandemResult], expires: datetime | None) -> None:
        """Celery's task-sent events, when task_send_sent_event is on. The tasks are
        enqueued by now: if Redis fails here, BrokerUnavailable carries them as
        `.accepted`."""
        if not self.settings.send_sent_event or not results:
            return
        try:
            with unavailable_as_tandem("the tasks were enqueued, but not their task-sent events"):
                self._send_events(model, [r.id for r in results], expires)
        except BrokerUnavailable as e:
            e.accepted = results
            raise

    def _send_events(self, model: str, task_ids: list[str], expires: datetime | None) -> None:
        queue = keys.l1(model)
        with self._events_lock:
            if self._dispatcher is None:
                self._dispatcher = self.app.events.Dispatcher(
                    self.app.connection_for_write(), enabled=True
                )
            for task_id in task_ids:
                self._dispatcher.send(
                    "task-sent",
                    uuid=task_id,
                    root_id=task_id,
                    parent_id=None,
                    name=message.TASK_NAME,
                    args="()",
                    kwargs=f"{{'model': {model!r}}}",
                    retries=0,
                    eta=None,
                    expires=expires.isoformat() if expires else None,
                    queue=queue,
                    exchange="",
                    routing_key=queue,
                )

    def close(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.close()
            self._dispatcher.connection.close()
        self.listener.close()
        stop_result_listener(self.app)
        self.redis.close()
        self.app.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def resolve(self, model: str) -> str:
        """NAME:VERSION as given, or NAME:latest made concrete. What `latest` means is read
        from the executor table at most once every LATEST_TTL_S per name, not per submit."""
        name, version = keys.parse_model(model)
        if version != "latest":
            if len(self._concrete) < keys.MODELS_REMEMBERED:
                self._concrete[model] = keys.l1(model)  # checked: submit need not ask again
            return model
        now = time.monotonic()
        cached = self._latest.get(name)
        if cached is not None and now - cached[1] < LATEST_TTL_S:
            return cached[0]
        try:
            with unavailable_as_tandem():
                latest = self.table.latest(name)
        except BrokerUnavailable as e:
            self._explain(e)
            raise
        if latest is None:
            raise UnknownModel(f"no worker has served any version of {name!r}")
        self._latest[name] = (latest, now)
        return latest

    def _encode(
        self,
        model: str,
        inputs: Any,
        priority: int,
        expires: datetime | None,
        task_id: str | None,
        binary: bool | None,
    ) -> tuple[str, str]:
        if not 0 <= priority <= 9:
            raise BadArgument(f"priority must be 0-9, got {priority}")
        task_id = task_id or self.listener.new_id()
        if binary is None:
            binary = _holds_tensors(inputs)
        envelope = message.encode_checked(
            model,
            inputs,
            queue=self._concrete.get(model) or keys.l1(model),
            task_id=task_id,
            priority=priority,
            expires=expires,
            binary=binary,
            limit=self.settings.max_message_bytes,
        )
        return task_id, envelope

    def _expect(self, task_ids: list[str], *, own: bool = False) -> None:
        """Have the listener keep these tasks' results, before they are routed (so none
        is stored before it listens). A task id given by the caller is not the
        listener's: its result comes through Celery's own subscription. own: every id
        was made by the listener."""
        try:
            self.listener.expect(
                task_ids if own else [t for t in task_ids if self.listener.hears(t)]
            )
        except redis.RedisError as e:
            error = BrokerUnavailable(f"cannot subscribe to results: {e}")
            self._explain(error)
            raise error from e

    def _result(self, task_id: str, executor: str | None, own: bool = False) -> TandemResult:
        """own: the listener made the id (else it asks), as for _expect."""
        self.submitted += 1
        self.to_l2 += executor is not None
        listener = self.listener if own or self.listener.hears(task_id) else None
        try:
            backend = self._local.backend  # the app's backend is one per thread, as Celery's
        except AttributeError:
            backend = self._local.backend = self.app.backend
        return TandemResult(
            task_id, executor=executor, listener=listener, app=self.app, backend=backend
        )


def _epoch(when: datetime | None) -> float | None:
    return None if when is None else when.timestamp()


def _holds_tensors(inputs: Any) -> bool:
    """True if inputs, or a value of an inputs dict, is a torch tensor or a numpy array."""
    if not isinstance(inputs, dict):
        return hasattr(inputs, "dtype") and hasattr(inputs, "shape")
    return any(hasattr(v, "dtype") and hasattr(v, "shape") for v in inputs.values())


def stop_result_listener(app: Any) -> None:
    """Stop this thread's Celery result listener, so results collected later need no Redis."""
    consumer = getattr(app.backend, "result_consumer", None)
    if consumer is not None and getattr(consumer, "_pubsub", None) is not None:
        consumer.stop()
        consumer._pubsub = None
