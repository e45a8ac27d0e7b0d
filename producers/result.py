"""A task's result, as Celery's AsyncResult, that also says where the task was routed."""

from __future__ import annotations

from typing import Any

from celery.app import app_or_default
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import AsyncResult, assert_will_not_block
from vine import promise

from tandem.producers.listener import ResultListener


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
