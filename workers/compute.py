"""One batch's compute, for the executor thread (workers/executor.py): prepare it, hand
its forward pass to the device thread, and meanwhile claim, prepare and stage the next
batch (the pair of second-level sets); then hand the results to the returner."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import redis

from tandem.broker import message
from tandem.broker.errors import ModelError, one_line
from tandem.broker.settings import Settings
from tandem.broker.state import Batch, State
from tandem.workers.computed import Computed
from tandem.workers.device import Pass, forward, forward_serially, forward_staged
from tandem.workers.latency import LatencyModel, Mean
from tandem.workers.models import Model
from tandem.workers.prepare import Preparer
from tandem.workers.returner import Returner
from tandem.workers.stages import InFlight, stage_in

log = logging.getLogger("tandem.executor")

#: A forward pass predicted shorter than this (ms) runs on the executor thread: handing
#: it to the device thread, and claiming the next batch meanwhile, would cost more.
INLINE_COMPUTE_MS = 1.0
#: The most the executor thread waits for the device thread to start a forward pass (s).
DEVICE_START_S = 1.0
#: The batch after the next is claimed early once claiming and staging one take more
#: than this share of a compute: the next batch's copy would not be done by the end of
#: the compute in hand (which, waiting for that copy, looks longer than it is).
AHEAD_SHARE = 0.8
#: How long (ms) before a pass should end the next batch is checked for revokes.
RECHECK_LEAD_MS = 5.0


class Computes:
    """The compute of one batch, mixed into Executor, which owns these."""

    id: str
    model: Model
    settings: Settings
    latency: LatencyModel
    revocations: bool
    staged: bool
    _timed: bool
    _prepare: Preparer
    _returner: Returner
    _device: ThreadPoolExecutor
    _computing: tuple[list[message.Task], float, float] | None
    _last_end: float | None
    _untold: State | None

    _stop: threading.Event
    #: The batch after the next, claimed and prepared early; staged once the next starts.
    _ahead: Batch | None
    #: How long claiming and preparing a batch early takes, and staging it (ms).
    _claiming_ms: Mean
    _staging_ms: Mean
    #: How many batches it claims ahead of the one computing: 2 where staging one takes
    #: nearly a compute, else 1 (its latency model's extra wait counts one compute each).
    batches_ahead: int

    def _tell(self, state: State) -> None: ...

    def _compute(self, batch: Batch, *, woke: bool = False) -> Batch:
        """Prepare a batch (decode, check, validate), top it up, and compute it on the
        device thread. Meanwhile, with the pipeline on, claim the next batch from L1 and
        prepare it (the pair of second-level sets). Returns that next batch, or [].

        Two hand-offs are skipped where they would cost more than they save: a forward
        pass predicted to take under INLINE_COMPUTE_MS runs on this thread (claiming
        early would overlap next to nothing), and a batch that woke an IDLE executor
        (woke: low load, nothing else waits to compute) is stored on this thread."""
        claimed_at = time.time()
        tasks = self._prepare.batch(batch, revocations=self.revocations)
        ready, live, inputs = [], [], []  # a loop: cold, each comprehension is a call
        for n, task in enumerate(tasks):
            if task.error is None:
                ready.append(n)
                live.append(task)
                inputs.append(task.inputs)
        suspect = bool(ready) and batch.redelivered
        if suspect and self._returner.alive:
            # A suspect computes with nothing else in in-flight: if it kills the process,
            # the previous batch, stored by now, is not blamed with it.
            self._returner.drain()
        outputs: dict[int, Any] = {}
        started_at = time.time()
        following = Batch()
        learned = 0  # the batch size the latency model learns a compute of, if any
        failed: Exception | None = None  # the early claim's error
        ran = Pass([], 0.0)
        if ready:
            inline = self.latency.ready and self.latency.compute_ms(len(ready)) < INLINE_COMPUTE_MS
            job = self._stage(batch.staged, live, inputs) if self.staged and not inline else None
            began = time.monotonic()
            if self._last_end is not None:
                self.latency.observe_gap((began - self._last_end) * 1000)
            self._computing = (live, started_at, began)
            try:
                if inline:
                    ran = forward(self.model, inputs)
                else:
                    if job is not None:
                        computing = self._on_device(forward_staged, self.model, job, inputs)
                    else:
                        way = forward_serially if self._timed else forward
                        computing = self._on_device(way, self.model, inputs)
                    if self.settings.pipeline and not suspect and not self._stop.is_set():
                        following, failed = self._claim_early(started_at, len(ready))
                    ran = self._result(computing, began, len(ready), following)
            finally:
                self._computing = None
            self._last_end = time.monotonic()
            if ran.staged is not None:
                learned = len(ready)
            else:
                assert ran.outputs is not None  # a pass not staged has them
                for n, out in zip(ready, ran.outputs, strict=True):
                    if isinstance(out, ModelError):
                        tasks[n].error = out
                    else:
                        outputs[n] = out
                if len(outputs) == len(ready):  # a bisected batch ran more than one pass
                    learned = len(ready)
        else:
            self._last_end = None  # nothing computed: the next gap is not one compute's
            if batch.staged is not None:
                batch.staged.done()
        compute_ms = ran.wall_ms
        done = Computed(tasks, outputs, claimed_at, started_at, compute_ms, device_ms=ran.device_ms)
        if ran.staged is not None:  # the returner copies its outputs out and splits them
            done.pending = (ran.staged, ready)
        elif ready:  # the serial path: its compute holds every stage
            done.stages = {**ran.times, "compute": ran.times.get("compute", compute_ms)}
        if woke:  # low load: the results go out first; the learning and bookkeeping after
            self._returner.store_now(done)
        if self._untold is not None:
            self._tell(self._untold)
        if learned:
            self.latency.observe_compute(learned, compute_ms)
        self._returner.hand_over(done)
        if failed is not None:
            raise failed
        if self._ahead is not None and not following:  # nothing claimed early took it
            following, self._ahead = self._ahead, None
        return following

    def _on_device(self, fn: Callable[..., Pass], *args: Any) -> Future[Pass]:
        """Run fn on the device thread, and return once it has started there. The claim
        that follows holds the GIL while it decodes, so a device thread still waking up
        would wait for it, up to a switch interval, before its forward pass began."""
        started = threading.Event()

        def run() -> Pass:
            started.set()
            return fn(*args)

        future = self._device.submit(run)
        started.wait(DEVICE_START_S)
        return future

    def _result(self, computing: Future[Pass], began: float, n: int, following: Batch) -> Pass:
        """The forward pass's result. With revocation records about, the next batch's
        tasks are checked against them once more just before the pass should end, so
        that round trip is not spent between the two computes."""
        if following.tasks and self.revocations and self.latency.ready:
            until = began + (self.latency.compute_ms(n) - RECHECK_LEAD_MS) / 1000
            wait([computing], timeout=max(0.0, until - time.monotonic()))
            if not computing.done():
                try:
                    self._prepare.recheck(following.tasks, revocations=True)
                    following.revokes_checked = time.monotonic()
                except redis.RedisError as e:
                    # Checked as it starts instead, once the batch in hand is stored.
                    log.info("executor %s: revoke check deferred (%s)", self.id, e)
        return computing.result()

    def _claim_early(self, started_at: float, n: int) -> tuple[Batch, Exception | None]:
        """While a batch of n computes: claim and prepare the next, planned from when this
        one should end, and stage it (or take the one claimed ahead during the last
        compute). Then, where claiming and staging a batch take nearly as long as
        computing one, claim and prepare the batch after it too, to be staged as soon as
        the next one starts. An error is returned, to be raised once this batch is handed
        over."""
        ends = (self.latency.compute_ms(n) + self.latency.gap_ms) / 1000
        early, self._ahead = self._ahead, None
        try:
            if early is None:
                early = self._claim(started_at + ends)
        except Exception as e:  # noqa: BLE001 - batch N is stored first, as before
            return Batch(), e
        if self.staged and early.tasks:
            live = [task for task in early.tasks if task.error is None]
            if live:
                early.staged = self._stage(None, live, [task.inputs for task in live])
                if early.staged is not None:
                    times = early.staged.times
                    self._staging_ms.add(times.get("collate", 0.0) + times.get("copy_in", 0.0))
        if early and self.latency.ready:
            ahead_ms = self._staging_ms.value + self._claiming_ms.value
            self.batches_ahead = 2 if ahead_ms > AHEAD_SHARE * ends * 1000 else 1
        if early and self.batches_ahead == 2:
            try:
                self._ahead = self._claim(started_at + 2 * ends) or None
            except Exception as e:  # noqa: BLE001 - as above
                return early, e
        return early, None

    def _claim(self, start_s: float) -> Batch:
        """Claim and prepare a batch from L1, planned to start at start_s (epoch s)."""
        began = time.perf_counter()
        batch = self._prepare.early(revocations=self.revocations, start_s=start_s)
        if batch:
            self._claiming_ms.add((time.perf_counter() - began) * 1000)
        return batch

    def _stage(self, early: InFlight | None, live: list, inputs: list) -> InFlight | None:
        """The batch's tasks collated and on their way to the device: as staged early, if
        its tasks are still the same, else staged now. None if staging fails: the batch
        then runs serially, bisected, so only the offending tasks fail."""
        key = tuple(map(id, live))
        if early is not None:
            if early.key == key:
                return early
            early.done()
        try:
            return stage_in(self.model, inputs, key)
        except Exception as e:  # noqa: BLE001 - a bad item fails alone, in forward()
            log.info("executor %s: staging a batch failed (%s); run serially", self.id, one_line(e))
            return None
