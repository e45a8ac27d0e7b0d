"""The producer client: one atomic route-and-enqueue per task, Celery results back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import redis

from tandem.broker import keys, message, tracing
from tandem.broker.app import make_app
from tandem.broker.connect import connect
from tandem.broker.discovery import joined_settings
from tandem.broker.errors import BadArgument, BrokerUnavailable, TandemError, UnknownModel
from tandem.broker.results import loads as load_result
from tandem.broker.retry import unavailable_as_tandem
from tandem.broker.settings import Settings
from tandem.broker.table import Table
from tandem.producers.listener import ResultListener
from tandem.producers.result import TandemResult

#: How long a Client keeps what NAME:latest resolved to, in seconds: a newer version that
#: comes up is used within this long.
LATEST_TTL_S = 1.0


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
        #: OpenTelemetry's tracer and tandem's send span, when this process traces.
        self._tracer = tracing.tracer("tandem-producer")
        self._send: Any = None
        if self._tracer is not None:
            from tandem.producers.tracing import Send

            self._send = Send

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
        send = None if self._send is None else self._sending(model, 1)
        try:
            trace = None if send is None else send.headers
            task_id, envelope = self._encode(
                model, inputs, priority, expires, task_id, binary, trace
            )
            self._expect([task_id], own=not task_id_given)
        except Exception as e:
            if send is not None:
                send.failed(e)
            raise
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
            if send is not None:
                send.routed([task_id], [e])
            raise
        if send is not None:
            send.routed([task_id], [executor])
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
        inputs = list(inputs)
        send = None if self._send is None else self._sending(model, len(inputs))
        try:
            trace = None if send is None else send.headers
            encoded = [
                self._encode(model, x, priority, expires, None, binary, trace) for x in inputs
            ]
            self._expect([task_id for task_id, _ in encoded])
        except Exception as e:
            if send is not None:
                send.failed(e)
            raise
        envelopes = [envelope for _, envelope in encoded]
        try:
            replies = self.table.route_many(
                model, envelopes, priority=priority, deadline=_epoch(expires)
            )
        except (BrokerUnavailable, UnknownModel) as e:
            e.accepted = self._accepted(model, encoded, e.routed, expires)[0]
            self._explain(e)
            if send is not None:
                send.routed([t for t, _ in encoded], [*e.routed, e])
            raise
        except Exception as e:
            self._accepted(model, encoded, [], expires)  # releases them all
            if send is not None:
                send.failed(e)
            raise
        if send is not None:
            send.routed([t for t, _ in encoded], replies)
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
        trace: dict[str, str] | None = None,
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
            trace=trace,
        )
        return task_id, envelope

    def _sending(self, model: str, count: int) -> Any:
        """The send span of a submit call (producers/tracing.py)."""
        return self._send(self._tracer, model, self._concrete.get(model) or keys.l1(model), count)

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
