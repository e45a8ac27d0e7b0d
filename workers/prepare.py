"""The prepare stage, on the executor thread: claim a batch's messages, decode each, check
it (its model, its deadline, a revocation), plan the batch, and validate the inputs of
the tasks planned in. A bad task gets its error set; nothing is raised, so one bad
message never stops a batch. With the pipeline on, the next batch is claimed and
prepared early, while the last one computes.

Deadline-aware, the plan weighs the batch against its tasks' deadlines by the latency
model (workers/deadlines.py): a task that would miss is shed (DeadlineExceeded, never
computed, never validated) and its slot refilled from L1; one that would meet it but
does not fit goes back to the head of L1."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime, timezone

from tandem.broker import message
from tandem.broker.errors import BadInput, DeadlineExceeded, Revoked, TandemError, UnknownModel
from tandem.broker.state import Batch
from tandem.broker.table import Table
from tandem.workers.deadlines import plan
from tandem.workers.latency import LatencyModel
from tandem.workers.models import Model

#: A batch stops refilling the slots of failed tasks (shed, expired, bad) once it holds
#: HELD_PER_SLOT x max_batch tasks, or HELD_MIN if that is more.
HELD_PER_SLOT = 8
HELD_MIN = 256
#: A batch prepared early whose tasks were checked for revokes this recently (s) is not
#: checked again as it starts (compute.py checks it just before the batch ahead ends).
REVOKES_FRESH_S = 0.02


class Preparer:
    def __init__(
        self,
        executor_id: str,
        model_ref: str,
        model: Model,
        table: Table,
        max_batch: int,
        max_bytes: int,
        *,
        latency: LatencyModel | None = None,
        slo_ms: float = 0.0,
        deadline_aware: bool = True,
    ) -> None:
        self.executor_id = executor_id
        self.model_ref = model_ref
        self.model = model
        self.table = table
        self.max_batch = max_batch
        self.max_bytes = max_bytes
        self.latency = latency or LatencyModel()
        self.slo_ms = slo_ms  # a task without its own deadline must be answered this soon
        self.deadline_aware = deadline_aware
        #: The most tasks one batch gathers while it refills the slots of failed ones.
        self.held_max = max(HELD_PER_SLOT * max_batch, HELD_MIN)

    def batch(self, batch: Batch, *, revocations: bool) -> list[message.Task]:
        """The tasks of the batch in hand, prepared (or, if prepared early, checked
        again), planned against their deadlines and topped up from L1."""
        if batch.tasks is not None:
            checked = batch.revokes_checked
            fresh = checked is not None and time.monotonic() - checked <= REVOKES_FRESH_S
            tasks = self.recheck(batch.tasks, revocations=revocations and not fresh)
            return self._fill(tasks, refill=True, start_s=0.0, revocations=revocations)
        tasks = self.prepare(batch, revocations=revocations)
        return self._fill(tasks, refill=False, start_s=0.0, revocations=revocations)

    def early(self, *, revocations: bool, start_s: float = 0.0) -> Batch:
        """While a batch computes: claim up to max_batch from L1 (never a retry task, which
        computes alone) and prepare it, planned to start at start_s (epoch s, when the
        compute in hand should end). The executor stays WORKING."""
        claimed = self.table.claim(self.executor_id, self.model_ref, self.max_batch)
        if not claimed:
            return Batch()
        tasks = self.prepare(claimed, revocations=revocations)
        tasks = self._fill(tasks, refill=False, start_s=start_s, revocations=revocations)
        return Batch([task.raw for task in tasks], tasks=tasks)

    def prepare(self, raws: Sequence[bytes], *, revocations: bool) -> list[message.Task]:
        """Decode and check each message (its model, its deadline; its inputs are
        validated once it is planned in). With revocations (Redis may hold revoke
        records), a revoked one gets Revoked and is never computed."""
        now = datetime.now(timezone.utc)
        tasks = [message.decode(raw, max_bytes=self.max_bytes) for raw in raws]
        revoked = self.table.revoked([t.id for t in tasks if t.id]) if revocations else ()
        for task in tasks:
            if task.id in revoked:
                task.error = Revoked(f"task {task.id} was revoked")
            self._check(task, now)
        return tasks

    def recheck(self, tasks: list[message.Task], *, revocations: bool) -> list[message.Task]:
        """Tasks prepared while the last batch computed, checked again as it starts: a
        revoke or a deadline may have come meanwhile."""
        now = datetime.now(timezone.utc)
        ids = [t.id for t in tasks if t.error is None and t.id]
        revoked = self.table.revoked(ids) if revocations and ids else ()
        for task in tasks:
            if task.error is None and task.id in revoked:
                task.error = Revoked(f"task {task.id} was revoked")
            task.check_deadline(now)
        return tasks

    def _fill(
        self, tasks: list[message.Task], *, refill: bool, start_s: float, revocations: bool
    ) -> list[message.Task]:
        """Plan the batch, and fill it from L1 up to max_batch: a batch prepared early
        (refill) takes what arrived while the last one computed; any batch refills the
        slots of tasks that failed before compute (expired, shed, bad input). Never from
        the retry list. A batch that handed tasks back is closed: it takes no more. Nor does
        one that holds `held_max` tasks: under a flood of tasks that are all shed, each
        batch stores its failures and the next claims on, so the work per claim stays
        flat and the shed are told soon."""
        tasks, closed = self._plan(tasks, start_s)
        ready = self._validate(tasks)
        while (
            not closed
            and ready < self.max_batch
            and len(tasks) < self.held_max
            and (refill or len(tasks) > ready)
        ):
            more = self.table.claim(self.executor_id, self.model_ref, self.max_batch - ready)
            if not more:
                break
            tasks, closed = self._plan(tasks + self.prepare(more, revocations=revocations), start_s)
            ready = self._validate(tasks)
            refill = False
        return tasks

    def _plan(self, tasks: list[message.Task], start_s: float) -> tuple[list[message.Task], bool]:
        """Shed the tasks that would miss their deadlines in this batch, started at
        start_s or now, whichever is later; hand back those that would meet them but do
        not fit. Returns the tasks left, and True if some went back."""
        if not (self.deadline_aware and self.latency.ready):
            return tasks, False
        live, timed = [], False  # a loop: cold, each comprehension is a function call
        for task in tasks:
            if task.error is None:
                live.append(task)
                timed = timed or task.deadline is not None
        if not timed:
            return tasks, False
        start = max(time.time(), start_s)
        latency = self.latency
        chosen = plan(
            [task.deadline for task in live],
            [task.priority for task in live],
            lambda n: start + latency.finish_ms(n) / 1000,
        )
        for n in chosen.shed:
            late = chosen.miss_ms(live[n].deadline)
            live[n].error = DeadlineExceeded(
                f"would miss its deadline by {late:.0f} ms (predicted for a batch of "
                f"{max(len(chosen.keep), 1)} here)"
            )
        if not chosen.back:
            return tasks, False
        back = [live[n] for n in chosen.back]
        self.table.unclaim(self.executor_id, self.model_ref, [task.raw for task in back])
        gone = {id(task) for task in back}
        return [task for task in tasks if id(task) not in gone], True

    def _check(self, task: message.Task, now: datetime) -> None:
        if task.error is None and task.model != self.model_ref:
            task.error = UnknownModel(
                f"task asks for model {task.model!r} but queue serves {self.model_ref!r}"
            )
        task.deadline = self._deadline(task)
        task.check_deadline(now)

    def _validate(self, tasks: list[message.Task]) -> int:
        """Run the model's validate() (tokenizing included) on each live task not yet
        validated: after the plan, so a task shed or handed back costs none of it.
        Returns how many tasks are live after it."""
        live = 0
        for task in tasks:
            if task.error is None and not task.validated:
                task.validated = True
                try:
                    task.inputs = self.model.validate(task.inputs)
                except TandemError as e:
                    task.error = e
                except Exception as e:  # noqa: BLE001 - a validator bug fails the task alone
                    task.error = BadInput(f"inputs rejected: {type(e).__name__}: {e}")
            live += task.error is None
        return live

    def _deadline(self, task: message.Task) -> float | None:
        """Its own (Celery's expires), else its send time plus the model's SLO."""
        if task.expires is not None:
            return task.expires.timestamp()
        if self.slo_ms and task.sent_at is not None:
            return task.sent_at + self.slo_ms / 1000
        return None
