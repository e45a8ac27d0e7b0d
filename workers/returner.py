"""The return stage, on the returner thread: store each computed batch's results (one
complete.lua call), run Celery's canvas steps around it, and tell the hooks. The slot
holds one batch, so batch N is stored while N+1 computes. A store that fails ends the
thread; the executor thread sees that and restarts, handing the batch's tasks back (a
crash, never a stall).

At low load the executor thread stores a batch's results itself (store_now) and hands
the rest to this thread: the canvas's next steps, the hooks, the bookkeeping.

The bookkeeping (the hooks' metrics counters, the executor's counts and, when it moved,
its latency model) is owed by each stored batch and sent in one count.lua call at most
every COUNT_EVERY_S: after the batch stored when it falls due, or on its own when no
batch comes, and before the thread ends. A batch's 15 or so counters cost Redis about
what its results do; folded over the batches of a quarter second they cost it little.
The first batch is counted at once. Only the results are on the task's path."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from typing import Any, Protocol

from tandem.broker import deadletter, keys, message, results
from tandem.broker.errors import ExecutorCrashed, ModelError, Revoked, one_line
from tandem.broker.retry import retry
from tandem.broker.settings import Settings
from tandem.broker.state import Speed
from tandem.broker.table import Table
from tandem.workers.canvas import Canvas
from tandem.workers.computed import Computed
from tandem.workers.hooks import Hook
from tandem.workers.latency import LatencyModel
from tandem.workers.stages import finish

log = logging.getLogger("tandem.executor")

#: The latency model is published again at least this often (s) while batches are stored,
#: and sooner when its rate or lag moved by more than 2 %.
REPUBLISH_S = 1.0
#: The owed bookkeeping of stored batches is sent at most this often (s). A scrape or the
#: coordinator sees counters this much later; a crash loses at most this much of them.
COUNT_EVERY_S = 0.25


class Owner(Protocol):
    """What the returner reads of its executor."""

    id: str
    model_ref: str
    worker: str
    table: Table
    settings: Settings
    hooks: list[Hook]
    canvas: Canvas | None
    latency: LatencyModel
    max_batch: int
    batches_ahead: int
    model: Any

    def tick(self) -> None: ...

    def stored(self, done: Computed) -> None: ...


class Returner:
    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.error: BaseException | None = None
        self._published: Speed | None = None  # the latency model as last published
        self._published_at = 0.0  # monotonic s
        self._owed: Counter = Counter()  # the metrics counters of batches not yet counted
        self._owed_tasks = 0
        self._owed_batches = 0
        self._counted_at = -COUNT_EVERY_S  # monotonic s: the first batch is counted at once
        self._slot: queue.Queue[Computed | None] = queue.Queue(maxsize=1)
        self._ended = False  # the thread's loop has returned
        self._thread = threading.Thread(
            target=self._loop, name=f"tandem return {owner.id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def check(self) -> None:
        """Raise ExecutorCrashed if the thread has ended (a store failed). Asked once per
        batch: a flag, which costs less cold than asking the thread."""
        if self._ended:
            raise ExecutorCrashed(f"its returner stopped: {self.error}")

    def hand_over(self, done: Computed) -> None:
        """Put a computed batch in the slot once there is room for it."""
        while True:
            self.check()
            try:
                self._slot.put(done, timeout=0.1)
                return
            except queue.Full:
                self.owner.tick()  # waiting on a live returner is progress

    def store_now(self, done: Computed) -> None:
        """Store a batch's results alone on the calling thread, once the slot's batch is
        stored; hand_over(done) then has the rest done on the returner thread. A store
        that fails raises ExecutorCrashed, as a failed returner thread would."""
        self.check()
        self.drain()
        try:
            self._put(done, wake_first=True)
        except Exception as e:  # noqa: BLE001 - reported as the returner thread reports it
            self._failed(e)
            raise ExecutorCrashed(f"storing results failed: {type(e).__name__}: {e}") from e
        done.results_out = True
        self.owner.stored(done)

    def drain(self) -> None:
        """Wait until the batch in the slot, if any, is stored. Only this executor's thread
        puts there, so a slot found empty stays so."""
        if self._slot.unfinished_tasks:
            self._slot.join()

    def close(self, timeout_s: float) -> None:
        """Store what the slot holds, then end the thread."""
        if self.alive:
            self._slot.put(None)
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        """Store each computed batch. It retries only disconnects (tandem.broker.retry): any
        other error ends it, and the executor thread then restarts."""
        try:
            self._serve()
        finally:
            self._ended = True

    def _serve(self) -> None:
        self.owner.table.patience(self.owner.tick, None)  # close() bounds a wait on stop
        while True:
            try:
                done = self._slot.get(timeout=self._count_in())
            except queue.Empty:
                self._count()  # nothing to store: what is owed goes now
                continue
            try:
                if done is None:
                    self._count()
                    return
                self._store(done)
            except Exception as e:  # noqa: BLE001 - reported to the executor thread
                self.error = e
                self._failed(e)
                return
            finally:
                self._slot.task_done()

    def _failed(self, e: Exception) -> None:
        log.error(
            "executor %s: storing results failed (%s: %s); the executor restarts "
            "and the batch's tasks go back through reclaim",
            self.owner.id,
            type(e).__name__,
            e,
        )

    def _store(self, done: Computed) -> None:
        """Store a batch's results unless they are out already (store_now), then what
        follows them; its bookkeeping is owed, and sent once due."""
        if not done.results_out:
            self._put(done)
            self.owner.stored(done)
        self._after(done)
        if done.counts:
            self._owed.update(self._counters(done))
            self._owed_tasks += len(done.tasks)
            self._owed_batches += 1
        if self._count_in() == 0:
            self._count()

    def _put(self, done: Computed, *, wake_first: bool = False) -> None:
        """The results in one complete.lua call, canvas steps first, as in Celery; the
        bookkeeping is sent after (_count). wake_first: see Steps.complete."""
        owner = self.owner
        if done.pending is not None:
            self._finish(done)
        for canvas, n, task in self._canvas(done):
            canvas.before_store(task, done.outputs.get(n))
        entries = [self._entry(n, task, done.outputs) for n, task in enumerate(done.tasks)]
        done.stored_at = time.time()
        size = retry(
            lambda: owner.table.complete(
                owner.id, entries, model=owner.model_ref, wake_first=wake_first
            ),
            what=f"executor {owner.id}",
            each_try=owner.tick,
            raise_refusals=True,  # a refused store restarts the executor (a crash, not a stall)
        )
        done.store_ended_at = time.time()
        done.counts = size is not None and size >= 0  # None: never, as no stop is given
        if done.outputs:
            ended = done.started_at + done.compute_ms / 1000
            owner.latency.observe_return((time.time() - ended) * 1000)

    def _finish(self, done: Computed) -> None:
        """A staged batch's outputs copied out and split into each task's result. If that
        fails, each of its tasks fails with the model's error."""
        staged, ready = done.pending
        done.pending = None
        try:
            results = finish(self.owner.model, staged)
            if len(results) != len(ready):
                raise ModelError(f"returned {len(results)} outputs for {len(ready)} inputs")
        except Exception as e:  # noqa: BLE001 - the batch's tasks fail, the executor lives
            error = e if isinstance(e, ModelError) else ModelError(f"model raised {one_line(e)}")
            for n in ready:
                done.tasks[n].error = error
        else:
            done.outputs.update(zip(ready, results, strict=True))
        done.stages = staged.times

    def _after(self, done: Computed) -> None:
        """What follows stored results: the canvas's next steps, then the hooks."""
        owner = self.owner
        for canvas, n, task in self._canvas(done):
            canvas.after_store(task, done.outputs.get(n))
        for hook in owner.hooks:
            try:
                hook.batch_done(owner, done)
            except Exception:  # noqa: BLE001 - a hook never stops results flowing
                log.exception("hook %s failed", type(hook).__name__)

    def _canvas(self, done: Computed) -> list[tuple[Canvas, int, message.Task]]:
        """The batch's tasks with canvas steps (link, chain, chord), by index, each with
        the canvas that runs them."""
        canvas = self.owner.canvas
        if canvas is None:
            return []
        return [(canvas, n, task) for n, task in enumerate(done.tasks) if task.canvas]

    def _count_in(self) -> float | None:
        """Seconds until the owed bookkeeping is due (0: now); None when none is owed."""
        if not self._owed_batches:
            return None
        return max(0.0, self._counted_at + COUNT_EVERY_S - time.monotonic())

    def _count(self) -> None:
        """The owed bookkeeping in one count.lua call, never retried (a retry could count
        it twice). Lost to a Redis error, it is logged, and the results, stored already,
        stand."""
        if not self._owed_batches:
            return
        owner = self.owner
        speed = self._speed()
        counters, tasks, batches = self._owed, self._owed_tasks, self._owed_batches
        self._owed, self._owed_tasks, self._owed_batches = Counter(), 0, 0  # sent once
        self._counted_at = time.monotonic()
        try:
            owner.table.count_batch(
                owner.id, owner.model_ref, tasks, batches=batches, counters=counters, speed=speed
            )
        except Exception as e:  # noqa: BLE001 - bookkeeping never stops results flowing
            log.warning(
                "executor %s: the counters of %d batch(es) were not added (%s: %s); their "
                "results are stored",
                owner.id,
                batches,
                type(e).__name__,
                e,
            )
            return
        if speed is not None:
            self._published, self._published_at = speed, time.monotonic()

    def _speed(self) -> Speed | None:
        """The latency model to publish with this batch, or None: deadline-aware off, no
        batch measured yet, or nothing moved since it was last published."""
        owner = self.owner
        if not owner.settings.deadline_aware or not owner.latency.ready:
            return None
        speed = owner.latency.speed(
            owner.max_batch, pipeline=owner.settings.pipeline, ahead=owner.batches_ahead
        )
        fresh = time.monotonic() - self._published_at < REPUBLISH_S
        return None if fresh and speed.close_to(self._published) else speed

    def _counters(self, done: Computed) -> Counter:
        """Every hook's metrics counters for this batch."""
        counts: Counter = Counter()
        for hook in self.owner.hooks:
            try:
                counts.update(hook.counters(self.owner, done))
            except Exception:  # noqa: BLE001 - a hook never stops results flowing
                log.exception("hook %s failed", type(hook).__name__)
        return counts

    def _entry(self, n: int, task: message.Task, outputs: dict[int, Any]) -> tuple[bytes, str, str]:
        model_ref = self.owner.model_ref
        if task.id is None:
            reason = f"{type(task.error).__name__}: {task.error}"
            return task.raw, "", deadletter.record(task.raw, reason, model=model_ref)
        extended = self._extended(task) if self.owner.settings.result_extended else None
        if isinstance(task.error, Revoked):
            return task.raw, keys.result(task.id), results.revoked(task.id)
        if task.error is not None:
            return task.raw, keys.result(task.id), results.failure(task.id, task.error, extended)
        return task.raw, keys.result(task.id), results.success(task.id, outputs[n], extended)

    def _extended(self, task: message.Task) -> dict:
        kwargs = {"model": task.model, "inputs": task.sent_inputs}
        return results.extended(
            message.TASK_NAME,
            kwargs,
            size=len(task.raw),
            worker=self.owner.worker,
            queue=task.queue,
        )
