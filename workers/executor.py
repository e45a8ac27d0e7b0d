"""One executor: one loaded model on one device, with the IDLE/WAITING/WORKING machine.

Three stages, one thread each, at most one batch in each:
- prepare (the executor thread, prepare.py): claim, decode, check and validate a batch
  (tokenizing included); with the pipeline on, it does this for batch N+1 while N
  computes, and tops N+1 up from L1 when N ends (the patent's pair of second-level sets);
- compute (the device thread, device.py): one forward pass;
- return (the returner thread, returner.py): store batch N's results while N+1 computes.
For a model with stages (stages.py), N+1 is also collated and copied in on the executor
thread, and N's outputs copied out and split on the returner: the device thread holds
the forward pass alone.
This module is the state machine around them, and the life cycle; compute.py holds the
compute of one batch.

Redis's in-flight list is the truth. After a Redis error the executor hands what
it holds back through reclaim and registers again; after a crash of its own
(a bug, a failed returner) it does the same with backoff, and gives up after
max_restarts in a row. The heartbeat thread reads its progress ticks.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis

from tandem.broker import message
from tandem.broker.errors import ExecutorCrashed, ExecutorGone, one_line
from tandem.broker.retry import retry
from tandem.broker.settings import Settings
from tandem.broker.signals import FullSignal
from tandem.broker.state import Batch, State, StrEnum
from tandem.broker.table import Table
from tandem.workers.canvas import Canvas
from tandem.workers.compute import Computes
from tandem.workers.computed import Computed
from tandem.workers.hooks import Hook, Logs
from tandem.workers.latency import LatencyModel, Mean
from tandem.workers.models import Model, describe, options
from tandem.workers.prepare import Preparer
from tandem.workers.returner import Returner
from tandem.workers.stages import staged

log = logging.getLogger("tandem.executor")


class Stuck(StrEnum):
    """Why an executor's heartbeat stops (Executor.stuck)."""

    HUNG = "hung"  # a compute ran past compute_timeout_s: the worker exits (code 70)
    STALLED = "stalled"  # another step did: the coordinator reclaims its tasks


class Executor(Computes):
    def __init__(
        self,
        model_ref: str,
        model: Model,
        *,
        table: Table,
        settings: Settings,
        worker: str,
        hooks: list[Hook] | None = None,
        on_give_up: Callable[[Executor], None] | None = None,
        canvas: Canvas | None = None,
    ) -> None:
        self.model_ref = model_ref
        self.model = model
        self.options = options(model, settings)
        self.max_batch, self.max_wait_ms = self.options.max_batch, self.options.max_wait_ms
        #: Its stages run apart (workers/stages.py): only the forward pass on the device.
        #: A model with stages and staging off runs them serially there, each timed.
        self.staged = settings.staging and staged(model)
        self._timed = staged(model) and not self.staged
        #: A task without its own deadline must be answered within this of its submit.
        self.slo_ms = self.options.slo_ms
        #: Its compute, gap and return times, learned from its own batches.
        self.latency = LatencyModel()
        self.table = table
        self.hooks: list[Hook] = hooks if hooks is not None else [Logs()]
        self.settings = settings
        self.worker = worker
        self.on_give_up = on_give_up
        self.canvas = canvas  # Celery's next steps (link, chain, chord); None skips them
        #: True while Redis may hold revocation records: each batch then asks which of
        #: its tasks are revoked (one round trip). Kept fresh by the worker's heartbeat
        #: and by revoke broadcasts, so a fleet without revocations pays nothing.
        self.revocations = True
        self.id = f"{worker}/{model_ref}/{uuid.uuid4().hex[:6]}"
        self.state = State.WORKING
        self._untold: State | None = None  # a state the hooks hear of later (_enter)
        self.batches = 0
        self.tasks = 0
        self.failed = 0
        self.restarts = 0
        self.gave_up = False
        self._in_a_row = 0  # restarts since the last stored batch
        self._ticked = time.monotonic()  # the loop's last sign of progress
        #: The compute in hand: its tasks, its start (epoch s) and its start (monotonic s).
        self._computing: tuple[list[message.Task], float, float] | None = None
        self._full: FullSignal | None = None  # the batch window's signal, if it has one
        #: When the last compute ended (monotonic s) while work was in hand; None once the
        #: executor went IDLE, so the gap to the next compute is not a busy one.
        self._last_end: float | None = None
        self._ahead: Batch | None = None
        self._claiming_ms, self._staging_ms = Mean(), Mean()
        self.batches_ahead = 1
        #: The device thread: runs each forward pass, so the executor thread can prepare
        #: the next batch meanwhile.
        self._device = ThreadPoolExecutor(1, thread_name_prefix=f"tandem device {self.id}")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"tandem {self.id}", daemon=True)
        self._returner = Returner(self)
        self._prepare = Preparer(
            self.id,
            model_ref,
            model,
            table,
            self.max_batch,
            settings.max_message_bytes,
            latency=self.latency,
            slo_ms=self.slo_ms,
            deadline_aware=settings.deadline_aware,
        )

    def __repr__(self) -> str:
        return (
            f"<Executor {self.id} state={self.state} batches={self.batches} "
            f"tasks={self.tasks} failed={self.failed} restarts={self.restarts}>"
        )

    @property
    def alive(self) -> bool:
        """False once the executor thread has ended or given up; its heartbeat then stops."""
        return self._thread.is_alive() and not self.gave_up

    def stuck(self, now: float) -> Stuck | None:
        """HUNG if a compute has run past compute_timeout_s, STALLED if any other step has,
        else None. `now` is time.monotonic()."""
        timeout = self.settings.compute_timeout_s
        if not timeout:
            return None
        computing = self._computing
        if computing is not None and now - computing[2] > timeout:
            return Stuck.HUNG
        if now - self._ticked > timeout:
            return Stuck.STALLED
        return None

    def computing(self) -> list[tuple[message.Task, float]]:
        """The tasks of the batch computing now, each with its start (epoch seconds)."""
        computing = self._computing
        if computing is None:
            return []
        tasks, started, _ = computing
        return [(task, started) for task in tasks]

    def info(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model_ref,
            "state": str(self.state),
            "batches": self.batches,
            "tasks": self.tasks,
            "failed": self.failed,
            "restarts": self.restarts,
            "mean_batch": round(self.tasks / self.batches, 2) if self.batches else 0.0,
        }

    # Life cycle

    def start(self) -> None:
        if self.max_wait_ms > 0 and self.max_batch > 1:
            self._full = FullSignal(self.table.redis, self.id)
        self._register()
        self._returner.start()
        self._thread.start()

    def request_stop(self) -> None:
        """Take no new L2 tasks (STOPPING); the loop ends after the batch in hand."""
        if self._stop.is_set():
            return
        self._stop.set()
        try:
            self.table.set_state(self.id, self.model_ref, State.STOPPING)
        except (redis.RedisError, ExecutorGone) as e:
            log.warning("executor %s could not mark itself STOPPING: %s", self.id, e)

    def stop(self, timeout_s: float = 60.0) -> None:
        """request_stop(), then finish the batch computing and return its results, hand the
        one claimed early and L2 back to L1, deregister. An IDLE one notices within
        poll_ms. So a stop takes one compute at most, bounded by compute_timeout_s."""
        self.request_stop()
        self._thread.join(timeout_s)
        self._returner.close(timeout_s)
        if self._full is not None:
            self._full.close()
        self._device.shutdown(wait=False)
        self._hand_all_back("stopped")

    def terminate(self) -> None:
        """A cold stop: take no new tasks and hand back everything held now, the batch
        computing included, without waiting for it (its tasks run again elsewhere, with
        no delivery counted: the stop was asked for)."""
        self.request_stop()
        self._hand_all_back("terminated")

    def _hand_all_back(self, how: str) -> None:
        """Hand L2 and in-flight back to L1 and deregister, without counting deliveries."""
        try:
            moved = self.table.reclaim(self.id, self.model_ref, force=True)
        except redis.RedisError as e:
            log.warning(
                "executor %s %s without Redis (%s); the coordinator will hand its tasks "
                "back once its heartbeat lapses",
                self.id,
                how,
                e,
            )
            return
        log.info("executor %s %s; handed %d queued tasks back to L1", self.id, how, moved)

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
            max_queue=self.options.max_queue,
            slo_ms=self.slo_ms,
        )
        self.table.publish_spec(self.model_ref, describe(self.model, self.max_batch))
        self.state = State.WORKING

    # The executor thread: IDLE waits on L2, WORKING claims or computes the batch in hand.

    def _run(self) -> None:
        self.table.patience(self.tick, self._stop)  # waiting for replicas is progress
        batch = Batch()
        while not self._stop.is_set() or batch:
            self.tick()
            try:
                self._returner.check()
                if batch and self._stop.is_set() and not batch.redelivered:
                    batch = self._give_back(batch)
                elif batch:
                    batch = self._compute(batch)  # the next batch, if it took one meanwhile
                elif self.state is State.IDLE:
                    batch = self._wait_for_batch()
                    if batch:  # it woke an IDLE executor: low load
                        batch = self._compute(batch, woke=True)
                else:
                    batch = self._claim_or_idle()
            except ExecutorGone:
                log.warning(
                    "executor %s was reclaimed (missed heartbeats); registering again", self.id
                )
                batch, self._ahead = Batch(), None
                self._retry(self._register)
            except redis.RedisError as e:
                log.error(
                    "executor %s: Redis error %s: %s; handing its tasks back and registering again",
                    self.id,
                    type(e).__name__,
                    e,
                )
                batch, self._ahead = Batch(), None
                self._retry(self._resync)
            except Exception as e:  # noqa: BLE001 - a bug or a failed returner: restart in place
                batch, self._ahead = Batch(), None
                if self._stop.is_set():  # no restart: stop() or terminate() hands its tasks back
                    log.warning("executor %s: %s while stopping", self.id, one_line(e))
                    return
                if not self._restart(e):
                    return

    def _give_back(self, batch: Batch) -> Batch:
        """Stopping: a batch not started yet (claimed early, or begun from L2) goes back to
        the head of L1 for the rest of the fleet, so a stop waits for one compute at most.
        (A redelivered task is computed: it must stay alone.)"""
        if batch.staged is not None:
            batch.staged.done()
        ahead, self._ahead = self._ahead or Batch(), None
        moved = self.table.unclaim(self.id, self.model_ref, list(batch) + list(ahead))
        log.info("executor %s stopping: %d unstarted tasks back to L1", self.id, moved)
        return Batch()

    def tick(self) -> None:
        """A sign of progress, which the heartbeat reads (see stuck())."""
        self._ticked = time.monotonic()

    def stored(self, done: Computed) -> None:
        """The returner stored a batch's results."""
        self.batches += 1
        self.tasks += len(done.tasks)
        self.failed += sum(task.error is not None for task in done.tasks)
        self._in_a_row = 0

    def _resync(self, *, count: bool = False) -> None:
        """Rebuild from Redis: hand in-flight and L2 back through reclaim, register again."""
        self._hand_back(count=count)
        self._register()

    def _hand_back(self, *, count: bool) -> None:
        """count: it crashed holding its in-flight tasks, so each gets a delivery."""
        self.table.reclaim(self.id, self.model_ref, force=True, count=count)

    def _restart(self, error: Exception) -> bool:
        """Restart in place after a crash, with backoff. False once it gives up."""
        self.restarts += 1
        self._in_a_row += 1
        # A returner that failed says nothing about the tasks; any other crash might.
        count = not isinstance(error, ExecutorCrashed)
        if self._in_a_row > self.settings.max_restarts:
            log.error(
                "executor %s crashed %d times in a row (last: %s: %s); giving up, so its "
                "worker exits non-zero",
                self.id,
                self._in_a_row,
                type(error).__name__,
                error,
            )
            self._retry(lambda: self._hand_back(count=count))
            self.gave_up = True
            if self.on_give_up is not None:
                self.on_give_up(self)
            return False
        delay = min(0.5 * 2 ** (self._in_a_row - 1), 10.0)
        log.error(
            "executor %s failed (%s: %s); restart %d in %.1fs, its tasks go back through "
            "reclaim first",
            self.id,
            type(error).__name__,
            error,
            self._in_a_row,
            delay,
            exc_info=error if count else None,  # a bug's traceback; a returner logged its own
        )
        self._stop.wait(delay)  # backoff before the restart
        self.tick()
        if self._returner.alive:
            self._returner.drain()  # let it store the batch it holds
        else:
            self._returner = Returner(self)
            self._returner.start()
        self._retry(lambda: self._resync(count=count))
        return True

    def _retry(self, step) -> None:
        """Run step until it succeeds or the executor stops, retrying Redis errors."""
        retry(step, what=f"executor {self.id}", stop=self._stop, each_try=self.tick)

    def _enter(self, state: State, *, tell_later: bool = False) -> None:
        """tell_later: the hooks hear of it from _tell(), once the results are out."""
        if state is State.IDLE:
            self._last_end = None
        if state != self.state:
            self.state = state
            if tell_later:
                self._untold = state
            else:
                self._tell(state)

    def _tell(self, state: State) -> None:
        """The hooks hear of a state change."""
        self._untold = None
        for hook in self.hooks:
            try:
                hook.state_changed(self, state)
            except Exception:  # noqa: BLE001 - a hook never stops the executor
                log.exception("hook %s failed", type(hook).__name__)

    def _claim_or_idle(self) -> Batch:
        """After a compute: claim a batch (one redelivered task alone, or up to max_batch
        from L1), or go IDLE if there is no work; one round trip either way."""
        batch = self.table.claim_or_idle(self.id, self.model_ref, self.max_batch)
        if batch is None:
            self._enter(State.IDLE)
            return Batch()
        return batch

    def _wait_for_batch(self) -> Batch:
        """IDLE: block on L2; the first task opens the batch window (WAITING), which lets
        L2 fill until it closes or route.lua says the batch is full. Tasks stay in L2
        meanwhile, which is as durable as in-flight; begin() takes them."""
        first = self.table.wait_l2(self.id, self.settings.poll_ms / 1000)
        if first is None:
            # Nothing routed; plain Celery publishers may have left work in L1.
            return self._begin(Batch())
        taken = Batch([first])
        if self.max_wait_ms <= 0:
            # The route script already made this executor WORKING.
            self._enter(State.WORKING, tell_later=True)
            return taken
        if self._full is not None:  # a batch window over one task (start() made it)
            self._full.clear()
            room = self.table.set_state(self.id, self.model_ref, State.WAITING)
            self._enter(State.WAITING)
            if room > 0:
                self.table.wait_full(self._full, self.max_wait_ms / 1000)
        return self._begin(taken)

    def _begin(self, taken: Batch) -> Batch:
        more = self.table.begin(
            self.id, self.model_ref, room=self.max_batch - len(taken), taken=len(taken)
        )
        batch = taken + more if taken else more  # a retry task comes alone, as `more`
        if batch:
            self._enter(State.WORKING)
        return batch
