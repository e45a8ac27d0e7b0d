"""One executor: one loaded model on one device, with the IDLE/WAITING/WORKING machine.

Two batch slots: the executor thread claims and computes one batch while a
returner thread stores the previous batch's results, so returning results
never holds up the next compute.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import redis

from broker import keys, message
from broker.errors import BadInput, ExecutorGone, ModelError, TandemError, UnknownModel
from broker.settings import Settings
from broker.table import State, Table
from workers import results
from workers.hooks import Hook, Logs
from workers.models import Model, batching

log = logging.getLogger("tandem.executor")


@dataclass
class Done:
    """A computed batch, waiting in the return slot. Times are epoch seconds."""

    tasks: list[message.Task]
    outputs: dict[int, Any]
    claimed_at: float = 0.0
    started_at: float = 0.0
    compute_ms: float = 0.0
    stored_at: float = 0.0


class Executor:
    def __init__(
        self,
        model_ref: str,
        model: Model,
        *,
        table: Table,
        settings: Settings,
        worker: str,
        hooks: list[Hook] | None = None,
    ) -> None:
        self.model_ref = model_ref
        self.model = model
        self.max_batch, self.max_wait_ms = batching(model, settings)
        self.table = table
        self.hooks = hooks if hooks is not None else [Logs()]
        self.settings = settings
        self.worker = worker
        self.id = f"{worker}/{model_ref}/{uuid.uuid4().hex[:6]}"
        self.state = State.WORKING
        self.batches = 0
        self.tasks = 0
        self.failed = 0
        self._stop = threading.Event()
        self._slot: queue.Queue[Done | None] = queue.Queue(maxsize=1)
        self._thread = threading.Thread(target=self._run, name=f"tandem {self.id}", daemon=True)
        self._returner = threading.Thread(
            target=self._return_loop, name=f"tandem return {self.id}", daemon=True
        )

    def __repr__(self) -> str:
        return (
            f"<Executor {self.id} state={self.state} batches={self.batches} "
            f"tasks={self.tasks} failed={self.failed}>"
        )

    @property
    def alive(self) -> bool:
        """False once the executor thread has died; its heartbeat then stops."""
        return self._thread.is_alive()

    def info(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model_ref,
            "state": str(self.state),
            "batches": self.batches,
            "tasks": self.tasks,
            "failed": self.failed,
            "mean_batch": round(self.tasks / self.batches, 2) if self.batches else 0.0,
        }

    # Life cycle

    def start(self) -> None:
        self._register()
        self._returner.start()
        self._thread.start()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Take no new L2 tasks (STOPPING), finish the batch in hand, return its results,
        hand L2 back to L1, deregister."""
        self._stop.set()
        try:
            self.table.set_state(self.id, State.STOPPING)
        except (redis.RedisError, ExecutorGone) as e:
            log.warning("executor %s could not mark itself STOPPING: %s", self.id, e)
        self._thread.join(timeout_s)
        self._slot.put(None)
        self._returner.join(timeout_s)
        try:
            moved = self.table.reclaim(self.id, self.model_ref, force=True)
        except redis.RedisError as e:
            log.warning(
                "executor %s stopped without Redis (%s); the coordinator will hand "
                "its tasks back once its heartbeat lapses",
                self.id,
                e,
            )
            return
        log.info("executor %s stopped; handed %d queued tasks back to L1", self.id, moved)

    def _register(self) -> None:
        s = self.settings
        self.table.register(
            self.id,
            self.model_ref,
            worker=self.worker,
            max_batch=self.max_batch,
            ttl_ms=int(s.heartbeat_ttl_s * 1000),
            max_wait_ms=self.max_wait_ms,
            pid=os.getpid(),
            max_queue=getattr(self.model, "max_queue", 0) or s.max_queue,
        )
        self.state = State.WORKING

    # The executor thread

    def _run(self) -> None:
        held: list[bytes] | None = None  # None: after a compute or a (re)register
        while not self._stop.is_set() or held:
            try:
                if held is None:
                    held = self._claim_or_idle()
                elif held:
                    self._compute(held)
                    held = [] if self._stop.is_set() else None
                else:
                    held = self._wait_for_batch()
            except ExecutorGone:
                log.warning(
                    "executor %s was reclaimed (missed heartbeats); registering again", self.id
                )
                self._retry(self._register)
                held = None
            except redis.RedisError as e:
                # What this thread holds may be stale: Redis's in-flight list is the truth.
                log.error(
                    "executor %s: Redis error %s: %s; handing its tasks back and registering again",
                    self.id,
                    type(e).__name__,
                    e,
                )
                self._retry(self._resync)
                held = None
            except Exception:
                # Unexpected: stop heartbeating so the coordinator hands the work on.
                log.exception(
                    "executor %s crashed; its tasks go back to L1 once it expires", self.id
                )
                raise

    def _resync(self) -> None:
        """Rebuild from Redis after an error: hand in-flight and L2 back, register again."""
        self.table.reclaim(self.id, self.model_ref, force=True)
        self._register()

    def _retry(self, step, *, stoppable: bool = True) -> None:
        """Run step until it succeeds, backing off on any Redis error (each one logged)."""
        delay = 0.1
        while not (stoppable and self._stop.is_set()):
            try:
                return step()
            except redis.RedisError as e:
                log.warning(
                    "executor %s: Redis error %s: %s; retrying in %.1fs",
                    self.id,
                    type(e).__name__,
                    e,
                    delay,
                )
                time.sleep(delay)  # backoff before retrying, not synchronisation
                delay = min(delay * 2, 2.0)

    def _moved(self, state: State) -> None:
        if state != self.state:
            self.state = state
            for hook in self.hooks:
                try:
                    hook.state_changed(self, state)
                except Exception:  # noqa: BLE001 - a hook never stops the executor
                    log.exception("hook %s failed", type(hook).__name__)

    def _claim_or_idle(self) -> list[bytes]:
        """After a compute: go IDLE if L1 is empty, else claim up to max_batch from it."""
        while True:
            if self.table.go_idle(self.id, self.model_ref, self.max_batch):
                self._moved(State.IDLE)
                return []
            held = self.table.claim(self.id, self.model_ref, self.max_batch)
            if held:
                return held

    def _wait_for_batch(self) -> list[bytes]:
        """IDLE: block on L2; the first task opens the batch window (WAITING)."""
        r = self.table.redis
        l2, inflight = keys.l2(self.id), keys.inflight(self.id)
        first = r.blmove(l2, inflight, self.settings.poll_ms / 1000, "RIGHT", "LEFT")
        if first is None:
            # Nothing routed; plain Celery publishers may have left work in L1.
            return self._begin([])
        taken = [first]
        if self.max_wait_ms <= 0:
            # The route script already made this executor WORKING.
            self._moved(State.WORKING)
            return taken
        if self.max_batch > 1:
            self.table.set_state(self.id, State.WAITING)
            self._moved(State.WAITING)
            self._hold_window(time.monotonic() + self.max_wait_ms / 1000)
        return self._begin(taken)

    def _hold_window(self, deadline: float) -> None:
        """WAITING: let L2 fill until the window closes or the batch is full (no capacity).

        Tasks stay in L2 meanwhile, which is as durable as in-flight; begin() takes them.
        Redis checks blocking timeouts only about every 100 ms, too coarse for a window
        of a few ms, so the window is kept here, looking at the capacity every ms.
        """
        key = keys.executor(self.id)
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            time.sleep(min(remaining, 0.001))  # the batch window itself
            if int(self.table.redis.hget(key, "cap") or 0) <= 0:
                return

    def _begin(self, taken: list[bytes]) -> list[bytes]:
        more = self.table.begin(
            self.id, self.model_ref, room=self.max_batch - len(taken), taken=len(taken)
        )
        held = taken + more
        if held:
            self._moved(State.WORKING)
        return held

    def _compute(self, held: list[bytes]) -> None:
        claimed_at = time.time()
        tasks = self._checked(held)
        ready = [n for n, task in enumerate(tasks) if task.error is None]
        # A task failed before compute (expired, bad input) frees its slot: refill it from L1.
        while len(tasks) > len(ready) and len(ready) < self.max_batch:
            more = self.table.claim(self.id, self.model_ref, self.max_batch - len(ready))
            if not more:
                break
            first = len(tasks)
            tasks += self._checked(more)
            ready += [n for n in range(first, len(tasks)) if tasks[n].error is None]
        outputs: dict[int, Any] = {}
        started_at = time.time()
        if ready:
            computed = self._run_isolated([tasks[n].inputs for n in ready])
            for n, out in zip(ready, computed, strict=True):
                if isinstance(out, ModelError):
                    tasks[n].error = out
                else:
                    outputs[n] = out
        compute_ms = (time.time() - started_at) * 1000
        self._slot.put(Done(tasks, outputs, claimed_at, started_at, compute_ms))

    def _checked(self, held: list[bytes]) -> list[message.Task]:
        """Decode and check each message; a bad one gets its error set, nothing raised."""
        now = datetime.now(timezone.utc)
        tasks = [message.decode(raw, max_bytes=self.settings.max_message_bytes) for raw in held]
        for task in tasks:
            self._check(task, now)
        return tasks

    def _check(self, task: message.Task, now: datetime) -> None:
        if task.error is None and task.model != self.model_ref:
            task.error = UnknownModel(
                f"task asks for model {task.model!r} but queue serves {self.model_ref!r}"
            )
        task.check_deadline(now)
        if task.error is None:
            try:
                task.inputs = self.model.validate(task.inputs)
            except TandemError as e:
                task.error = e
            except Exception as e:  # noqa: BLE001 - a validator bug fails the task, not the executor
                task.error = BadInput(f"inputs rejected: {type(e).__name__}: {e}")

    def _run_isolated(self, batch: list[Any]) -> list[Any]:
        """Run one forward pass; if it raises, bisect so only the offending tasks fail."""
        try:
            outputs = self.model.run(batch)
            if len(outputs) != len(batch):
                raise ModelError(f"returned {len(outputs)} outputs for {len(batch)} inputs")
        except Exception as e:  # noqa: BLE001 - any model failure is isolated, not fatal
            if len(batch) == 1:
                return [ModelError(f"model raised {type(e).__name__}: {e}")]
            mid = len(batch) // 2
            return self._run_isolated(batch[:mid]) + self._run_isolated(batch[mid:])
        return outputs

    # The returner thread

    def _return_loop(self) -> None:
        while (done := self._slot.get()) is not None:
            entries = [self._entry(n, task, done.outputs) for n, task in enumerate(done.tasks)]
            self._retry(
                lambda e=entries: self.table.complete(self.id, e, self.settings.result_expires_s),
                stoppable=False,
            )
            done.stored_at = time.time()
            self.batches += 1
            self.tasks += len(done.tasks)
            self.failed += sum(task.error is not None for task in done.tasks)
            for hook in self.hooks:
                try:
                    hook.batch_done(self, done)
                except Exception:  # noqa: BLE001 - a hook never stops results flowing
                    log.exception("hook %s failed", type(hook).__name__)

    def _entry(self, n: int, task: message.Task, outputs: dict[int, Any]) -> tuple[bytes, str, str]:
        if task.id is None:
            return task.raw, "", ""
        if task.error is not None:
            return task.raw, keys.result(task.id), results.failure(task.id, task.error)
        return task.raw, keys.result(task.id), results.success(task.id, outputs[n])
